"""The composer: genuine LearningProcess, readable errors, hparams, model weights."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

import tff_comp  # pylint: disable=unused-import
from tff_comp import client_work
from tff_comp import composer
from tff_comp import models
from tff_comp import regularizers
from tff_comp import server_updates
from tff_comp.algorithms import common
from tff_comp.algorithms import feddualavg
from tff_comp.ops import client_updates

D = 4
MODEL = models.linear_regression((D,))
WEIGHTS_TYPE = client_work.model_weights_type(MODEL)


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(12, D)).astype(np.float32)
  return [tf.data.Dataset.from_tensor_slices((x, x.sum(1)))] * 2


def test_mismatched_payload_names_both_blocks():
  dual_rule = client_updates.DualAveraging(
      MODEL, learning_rate=0.1, regularizer=regularizers.L1(strength=0.1))
  dual_update = server_updates.build_dual_averaging_update(
      common.server_sgd(1.0, 0.0), WEIGHTS_TYPE, regularizers.L1(strength=0.1))
  work = client_work.build_local_client_work(
      dual_rule, dual_update.client_payload.type_signature.result, batch_size=2)
  with pytest.raises(composer.CompositionError,
                     match=r'(?s)server_update.client_payload produces.*but client_work expects'):
    composer.compose_learning_process(
        initial_model_weights_fn=common.initial_weights_fn(MODEL), client_work=work,
        aggregator=tff.aggregators.MeanFactory(),
        server_update=server_updates.build_optimizer_update(
            common.server_sgd(1.0, 0.0), WEIGHTS_TYPE))


def test_mismatched_update_names_aggregator_and_server_update():
  rule = client_updates.SGD(MODEL, learning_rate=0.1)
  work = client_work.build_local_client_work(rule, WEIGHTS_TYPE, batch_size=2)
  with pytest.raises(composer.CompositionError, match='(?s)aggregator produces.*server_update expects'):
    composer.compose_learning_process(
        initial_model_weights_fn=common.initial_weights_fn(MODEL), client_work=work,
        aggregator=tff.aggregators.MeanFactory(),
        server_update=server_updates.build_mirror_descent_update(
            common.server_sgd(1.0, 0.0), WEIGHTS_TYPE, regularizers.L1(strength=0.1)))


def test_unweighted_aggregator_is_rejected_with_a_hint():
  rule = client_updates.SGD(MODEL, learning_rate=0.1)
  with pytest.raises(composer.CompositionError, match='MeanFactory'):
    composer.compose_learning_process(
        initial_model_weights_fn=common.initial_weights_fn(MODEL),
        client_work=client_work.build_local_client_work(rule, WEIGHTS_TYPE, batch_size=2),
        aggregator=tff.aggregators.UnweightedMeanFactory(),
        server_update=server_updates.build_optimizer_update(
            common.server_sgd(1.0, 0.0), WEIGHTS_TYPE))


def test_process_works_with_tff_training_loop_and_hparams():
  process = feddualavg.build_feddualavg(
      MODEL, regularizer=regularizers.L1(strength=0.01), client_learning_rate=0.05,
      server_learning_rate=1.0, batch_size=3)
  assert isinstance(process, tff.learning.templates.LearningProcess)
  datasets = _data()
  state = tff.simulation.run_training_process(
      process, training_selection_fn=lambda r: datasets, total_rounds=2)
  hparams = process.get_hparams(state)
  assert hparams['client_work']['learning_rate'] == pytest.approx(0.05)
  assert hparams['server_update']['learning_rate'] == pytest.approx(1.0)
  hparams['client_work']['learning_rate'] = np.float32(0.0)
  hparams['server_update']['learning_rate'] = np.float32(0.0)
  frozen = process.set_hparams(state, hparams)
  after = process.next(frozen, datasets).state
  np.testing.assert_allclose(process.get_model_weights(after).trainable[0],
                             process.get_model_weights(frozen).trainable[0])


def test_set_model_weights_restarts_the_dual_state():
  process = feddualavg.build_feddualavg(
      MODEL, regularizer=regularizers.L1(strength=0.01), client_learning_rate=0.05,
      batch_size=3)
  state = process.next(process.initialize(), _data()).state
  new = tff.learning.models.ModelWeights(
      (np.full([D], 0.5, np.float32), np.float32(0.25)), ())
  state = process.set_model_weights(state, new)
  np.testing.assert_allclose(state.finalizer['dual'][0], 0.5)
  assert state.finalizer['elapsed'] == 0.0
  np.testing.assert_allclose(process.get_model_weights(state).trainable[0], 0.5)
