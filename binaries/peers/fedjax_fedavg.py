r"""FedJAX's FedAvg on bench part 1's shape, for same-run comparisons (`make bench-peers`).

    .venv-fedjax/bin/python binaries/peers/fedjax_fedavg.py [--rounds=30] [--repeats=3]

Runs in FedJAX's own virtual environment (requirements/fedjax.txt), never imported by
tff_comp. `--workload=cnn`: part 6's EMNIST CNN on its synthetic clients (haiku).
`--workload=lasso`: linear regression with d inputs and a bias (squared loss), `--clients`
clients a round drawn from 64 clients of 128 examples, batch `--batch_size`, one epoch
of client SGD at `--learning_rate`, server SGD at 1.0: lasso I's FedAvg round as
`binaries/bench.py` part 1 times it. FedJAX shuffles each client's examples (as
tff_comp does by default). Prints the median of `--repeats` timings of `--rounds`
rounds, after three rounds of warm-up (compiling), as its last word.

`--serve` and `--check` as `protocol.py` says (check: no shuffling, `skip_shuffle`).
"""

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fedjax
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import optax
import protocol


def _linear(dim: int):
  """Part 1's model: y = <w, x> + b, loss 0.5 * squared error."""

  def forward(batch):
    return hk.Linear(1)(batch['x'])[:, 0]

  return fedjax.create_model_from_haiku(
    hk.transform(forward),
    {'x': np.zeros((1, dim), np.float32)},
    train_loss=lambda batch, prediction: 0.5 * jnp.square(prediction - batch['y']),
  )


def _cnn():
  """Part 6's EMNIST CNN (the layers of `tasks.emnist.cnn`), cross-entropy loss."""

  def forward(batch):
    x = jax.nn.relu(hk.Conv2D(32, 3, padding='VALID')(batch['x']))
    x = jax.nn.relu(hk.Conv2D(64, 3, padding='VALID')(x))
    x = hk.Flatten()(hk.max_pool(x, 2, 2, 'VALID'))
    return hk.Linear(protocol.CNN_CLASSES)(jax.nn.relu(hk.Linear(128)(x)))

  return fedjax.create_model_from_haiku(
    hk.transform(forward),
    {'x': np.zeros((1, 28, 28, 1), np.float32)},
    train_loss=lambda batch, logits: optax.softmax_cross_entropy_with_integer_labels(
      logits, batch['y']
    ),
  )


def _fed_avg(model, lr: float, batch: int, shuffle: bool):
  """FedJAX's FedAvg of a haiku `model`; its initial parameters."""
  algorithm = fedjax.algorithms.fed_avg.federated_averaging(
    fedjax.model_grad(model),
    fedjax.optimizers.sgd(lr),
    fedjax.optimizers.sgd(1.0),
    fedjax.ShuffleRepeatBatchHParams(batch_size=batch, num_epochs=1, skip_shuffle=not shuffle),
  )
  return algorithm, model.init(jax.random.PRNGKey(0))


def _round(algorithm, data, state, ids, key):
  """One round over the clients `ids` (bytes); the new state."""
  state, _ = algorithm.apply(
    state,
    [
      (cid, dataset, k)
      for (cid, dataset), k in zip(data.get_clients(ids), jax.random.split(key, len(ids)))
    ],
  )
  jax.block_until_ready(state.params)
  return state


def _check(inputs: str, output: str) -> None:
  given = protocol.read_check(inputs)
  dim = given['x'].shape[2]
  algorithm, params = _fed_avg(
    _linear(dim), float(given['learning_rate']), int(given['batch_size']), shuffle=False
  )
  params['linear']['w'] = jnp.asarray(given['kernel'].reshape(dim, 1))
  params['linear']['b'] = jnp.asarray(given['bias'].reshape(1))
  data = fedjax.InMemoryFederatedData(
    {str(i).encode(): {'x': x, 'y': y} for i, (x, y) in enumerate(zip(given['x'], given['y']))}
  )
  state = algorithm.init(params)
  for r, picks in enumerate(given['picks']):
    ids = [str(int(i)).encode() for i in picks]
    state = _round(algorithm, data, state, ids, jax.random.PRNGKey(r))
  protocol.write_weights(output, state.params['linear']['w'], state.params['linear']['b'][0])


def main() -> None:
  args = protocol.parse_args()
  if args.check:
    _check(*args.check.split(','))
    return
  clients = protocol.workload(args)
  data = fedjax.InMemoryFederatedData(
    {str(i).encode(): {'x': x, 'y': y} for i, (x, y) in enumerate(clients)}
  )
  model = _linear(args.dim) if args.workload == 'lasso' else _cnn()
  algorithm, params = _fed_avg(model, args.learning_rate, args.batch_size, shuffle=True)
  state = [algorithm.init(params)]
  picks = protocol.selections(args.clients, len(clients))
  keys = (jax.random.fold_in(jax.random.PRNGKey(1), r) for r in itertools.count())

  def run_round():
    ids = [str(i).encode() for i in next(picks)]
    state[0] = _round(algorithm, data, state[0], ids, next(keys))

  blocks = protocol.Blocks(args)
  protocol.drive(run_round, blocks)
  if not args.serve:
    print(f'fedjax fedavg ({args.workload}) s/round {blocks.median():.6f}')


if __name__ == '__main__':
  main()
