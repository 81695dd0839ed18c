"""The composer: genuine LearningProcess, readable errors, hparams, model weights."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tff_comp import models
from tff_comp.algorithms import common, feddualavg
from tff_comp.learning_process import client_work, composer, server_update
from tff_comp.ops import client_round, composite, model_ops, regularizers, sgd

D = 4
MODEL = models.linear_regression((D,))
WEIGHTS_TYPE = client_work.model_weights_type(MODEL)
SPECS = model_ops.trainable_specs(MODEL)
OPTIONS = client_round.ClientOptions(batch_size=2)


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(12, D)).astype(np.float32)
  return [tf.data.Dataset.from_tensor_slices((x, x.sum(1)))] * 2


def test_mismatched_payload_names_both_blocks():
  dual_rule = composite.DualAveraging(
    MODEL, learning_rate=0.1, regularizer=regularizers.L1(strength=0.1)
  )
  dual_update = server_update.build_server_update(
    composite.DualAveragingServer(
      SPECS, common.server_sgd(1.0, 0.0), regularizers.L1(strength=0.1)
    ),
    WEIGHTS_TYPE,
  )
  work = client_work.build_local_client_work(
    dual_rule, dual_update.client_payload.type_signature.result, OPTIONS
  )
  with pytest.raises(
    composer.CompositionError,
    match=r'(?s)server_update.client_payload produces.*but client_work expects',
  ):
    composer.compose_learning_process(
      initial_model_weights_fn=composer.initial_weights_fn(MODEL),
      client_work=work,
      aggregator=tff.aggregators.MeanFactory(),
      server_update=server_update.build_server_update(
        sgd.OptimizerServer(SPECS, common.server_sgd(1.0, 0.0)), WEIGHTS_TYPE
      ),
    )


def test_mismatched_update_names_aggregator_and_server_update():
  rule = sgd.SGD(MODEL, learning_rate=0.1)
  work = client_work.build_local_client_work(rule, WEIGHTS_TYPE, OPTIONS)
  with pytest.raises(
    composer.CompositionError, match='(?s)aggregator produces.*server_update expects'
  ):
    composer.compose_learning_process(
      initial_model_weights_fn=composer.initial_weights_fn(MODEL),
      client_work=work,
      aggregator=tff.aggregators.MeanFactory(),
      server_update=server_update.build_server_update(
        composite.MirrorDescentServer(
          SPECS, common.server_sgd(1.0, 0.0), regularizers.L1(strength=0.1)
        ),
        WEIGHTS_TYPE,
      ),
    )


def test_unweighted_aggregator_is_rejected_with_a_hint():
  rule = sgd.SGD(MODEL, learning_rate=0.1)
  with pytest.raises(composer.CompositionError, match='MeanFactory'):
    composer.compose_learning_process(
      initial_model_weights_fn=composer.initial_weights_fn(MODEL),
      client_work=client_work.build_local_client_work(rule, WEIGHTS_TYPE, OPTIONS),
      aggregator=tff.aggregators.UnweightedMeanFactory(),
      server_update=server_update.build_server_update(
        sgd.OptimizerServer(SPECS, common.server_sgd(1.0, 0.0)), WEIGHTS_TYPE
      ),
    )


def test_process_works_with_tff_training_loop_and_hparams():
  process = feddualavg.build_feddualavg(
    MODEL,
    regularizer=regularizers.L1(strength=0.01),
    client_learning_rate=0.05,
    server_learning_rate=1.0,
    batch_size=3,
  )
  assert isinstance(process, tff.learning.templates.LearningProcess)
  datasets = _data()
  state = tff.simulation.run_training_process(
    process, training_selection_fn=lambda r: datasets, total_rounds=2
  )
  hparams = process.get_hparams(state)
  assert hparams['client_work']['learning_rate'] == pytest.approx(0.05)
  assert hparams['finalizer']['learning_rate'] == pytest.approx(1.0)
  hparams['client_work']['learning_rate'] = np.float32(0.0)
  hparams['finalizer']['learning_rate'] = np.float32(0.0)
  frozen = process.set_hparams(state, hparams)
  after = process.next(frozen, datasets).state
  np.testing.assert_allclose(
    process.get_model_weights(after).trainable[0], process.get_model_weights(frozen).trainable[0]
  )


def test_set_model_weights_restarts_the_dual_state():
  process = feddualavg.build_feddualavg(
    MODEL, regularizer=regularizers.L1(strength=0.01), client_learning_rate=0.05, batch_size=3
  )
  state = process.next(process.initialize(), _data()).state
  new = tff.learning.models.ModelWeights((np.full([D], 0.5, np.float32), np.float32(0.25)), ())
  state = process.set_model_weights(state, new)
  np.testing.assert_allclose(state.finalizer.dual[0], 0.5)
  assert state.finalizer.elapsed == 0.0
  np.testing.assert_allclose(process.get_model_weights(state).trainable[0], 0.5)


def test_the_documented_composition_example_is_a_working_process(repo_root):
  """docs/architecture.md's composition example runs, and equals the registered
  feddualavg."""
  readme = (repo_root / 'docs' / 'architecture.md').read_text()
  code = readme.split('```python\n')[1].split('```')[0]
  namespace = {}
  exec(code, namespace)
  process = namespace['process']
  assert isinstance(process, tff.learning.templates.LearningProcess)
  model = namespace['model']
  registered = feddualavg.build_feddualavg(
    model,
    regularizer=regularizers.L1(strength=0.3),
    client_learning_rate=1e-3,
    server_learning_rate=10.0,
  )
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 20, 1024)).astype(np.float32)
  data = [tf.data.Dataset.from_tensor_slices((x[i], x[i].sum(1))) for i in range(2)]
  got = process.next(process.initialize(), data).state
  want = registered.next(registered.initialize(), data).state
  for a, b in zip(
    process.get_model_weights(got).trainable, registered.get_model_weights(want).trainable
  ):
    np.testing.assert_allclose(a, b, atol=1e-6)
