"""Server optimizers by name (`--server_optimizer`): FedAvg with each, on the in-process
runtime, against TFF's own `build_weighted_fed_avg` with the same server optimizer on
the same inputs (an independent implementation of the whole round)."""

import json

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tests import algorithm_cases
from tff_comp import experiment, server_optimizers
from tff_comp.algorithms import fedavg
from tff_comp.runtime import inprocess

DATA = algorithm_cases.DATA['unequal']
ROUNDS = [['c0', 'c2', 'c4'], ['c1', 'c3', 'c4'], ['c0', 'c1', 'c3'], ['c2', 'c3', 'c4']]
B, LR, SERVER_LR = 3, 0.02, 0.5


@pytest.mark.parametrize(
  'name',
  [n if n == 'adam' else pytest.param(n, marks=pytest.mark.slow) for n in server_optimizers.NAMES],
)
def test_fedavg_with_each_server_optimizer_matches_tffs_builtin(name):
  ours = inprocess.build(
    fedavg.fedavg(
      algorithm_cases.MODEL,
      client_learning_rate=LR,
      batch_size=B,
      server_optimizer=server_optimizers.build(name, SERVER_LR),
    ).with_client_options(shuffle=False),
    DATA,
  )  # as TFF's FedAvg reads a client's data
  theirs = tff.learning.algorithms.build_weighted_fed_avg(
    algorithm_cases.MODEL,
    client_optimizer_fn=tff.learning.optimizers.build_sgdm(LR),
    server_optimizer_fn=server_optimizers.build(name, SERVER_LR),
  )
  ours_state, theirs_state = ours.initialize(), theirs.initialize()
  for ids in ROUNDS:
    ours_state = ours.next(ours_state, ids).state
    theirs_state = theirs.next(
      theirs_state, [DATA.create_tf_dataset_for_client(cid).batch(B) for cid in ids]
    ).state
  got = ours.get_model_weights(ours_state).trainable
  want = theirs.get_model_weights(theirs_state).trainable
  start = algorithm_cases.MODEL.initial_weights[0]
  assert max(np.abs(np.asarray(w) - s).max() for w, s in zip(want, start)) > 0.05
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# Adam's parity with TFF's Adam above already fails on SGD's steps: make test-slow.
@pytest.mark.slow
def test_adaptive_servers_differ_from_sgd():
  """The name reaches the process: Adam's first steps (about lr per coordinate) are not
  SGD's (lr times the update)."""
  finals = {}
  for name in ('sgd', 'adam'):
    process = inprocess.build(
      fedavg.fedavg(
        algorithm_cases.MODEL,
        client_learning_rate=LR,
        batch_size=B,
        server_optimizer=server_optimizers.build(name, SERVER_LR),
      ),
      DATA,
    )
    state = process.next(process.initialize(), ROUNDS[0]).state
    finals[name] = np.asarray(process.get_model_weights(state).trainable[0])
  assert np.abs(finals['sgd'] - finals['adam']).max() > 1e-3


def _config(tmp_path, **fields):
  return experiment.ExperimentConfig.of(
    algorithm=fields.pop('algorithm', 'fedavg'),
    task='quadratic',
    rounds=2,
    output_dir=str(tmp_path),
    **fields,
  )


def test_a_run_takes_a_server_optimizer_by_name_and_records_it(tmp_path):
  prepared = experiment.prepare(
    _config(tmp_path, server_optimizer='yogi', server_learning_rate=0.1)
  )
  assert isinstance(prepared.builder_args['server_optimizer'], tff.learning.optimizers.Optimizer)
  experiment.run_experiment(prepared, show_progress=False)
  recorded = (tmp_path / 'config.json').read_text()
  assert '"server_optimizer": "yogi"' in recorded
  # The betas given as defaults (null) are recorded in force: TFF's Yogi's own.
  in_force = json.loads(recorded)['resolved']['server_hparams']
  assert in_force['beta_1'] == pytest.approx(0.9) and in_force['beta_2'] == pytest.approx(0.99)
  header = (tmp_path / 'metrics.csv').read_text().splitlines()[0]
  assert 'hparams/finalizer/beta_2' in header  # Yogi's hyperparameters are the server's


@pytest.mark.parametrize('runtime', ['inprocess', 'tff'])
def test_an_adaptive_server_takes_scheduled_and_grid_rates(tmp_path, runtime):
  """Rates set through the hparams (a schedule, a grid's rates) keep the dtype the
  optimizer's state holds: Adam's hparams are float64 and a float32 rate among them
  would fail its update."""
  prepared = experiment.prepare(
    _config(
      tmp_path,
      server_optimizer='adam',
      server_learning_rate=0.1,
      runtime=runtime,
      client_lr_schedule='exponential',
      server_lr_schedule='inverse_sqrt',
    )
  )
  runner = experiment.build_runner(prepared)
  final = experiment.train_runner(prepared, runner, show_progress=False, learning_rates=(0.01, 0.2))
  assert final and all(np.isfinite(v) for v in final.values())


@pytest.mark.parametrize(
  'fields, says',
  [
    (dict(algorithm='qfedavg', server_optimizer='adam'), 'runs no server optimizer'),
    (dict(server_optimizer='adam', server_beta_1=1.0), '--server_beta_1 must be in [0, 1)'),
    (dict(server_optimizer='adam', server_epsilon=0.0), '--server_epsilon must be > 0'),
    (
      dict(server_optimizer='sgdm', algorithm_options=dict(server_momentum=0.5)),
      '--server_momentum',
    ),
    (dict(server_beta_2=0.9), 'without --server_optimizer'),
  ],
)
def test_a_bad_server_optimizer_setting_is_one_line(tmp_path, fields, says):
  with pytest.raises(experiment.ConfigError, match=None) as error:
    experiment.prepare(_config(tmp_path, **fields))
  assert says in str(error.value) and '\n' not in str(error.value)


@pytest.mark.parametrize('name', ['adam', 'yogi'])
def test_adaptive_server_steps_follow_the_papers_update_rules(name):
  """Against NumPy written from the papers, not from `server_optimizers.build` (the
  builtin test above builds both sides with it, so a swap of beta_1 and beta_2 passed
  it): Adam (Kingma and Ba, 2015, with the bias corrections folded into the step size as
  in their section 2) and Yogi's additive second moment (Zaheer et al., 2018), each
  hyperparameter of its own value so a swap shows."""
  lr, beta_1, beta_2, epsilon = 0.1, 0.7, 0.95, 1e-2
  grads = np.random.default_rng(0).normal(size=(4, 3))
  optimizer = server_optimizers.build(name, lr, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon)
  weights = tf.ones([3])
  state = optimizer.initialize(tf.TensorSpec([3], tf.float32))
  for g in grads:
    state, weights = optimizer.next(state, weights, tf.constant(g, tf.float32))
  w, m = np.ones(3), np.zeros(3)
  v = np.full(3, 1e-6 if name == 'yogi' else 0.0)  # TFF's initial second moments
  for t, g in enumerate(grads, start=1):
    m = beta_1 * m + (1 - beta_1) * g
    v = (
      beta_2 * v + (1 - beta_2) * g**2
      if name == 'adam'
      else v - (1 - beta_2) * np.sign(v - g**2) * g**2
    )
    w = w - lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (np.sqrt(v) + epsilon)
  np.testing.assert_allclose(weights, w, rtol=1e-5)
