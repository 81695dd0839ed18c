"""The bytes a client sends and receives a round (`ops.communication.client_bytes`),
counted by hand from each algorithm's paper for a linear model of 5 features (a [5, 1]
kernel and a bias: 6 floats, 24 bytes), on populations whose size equals a weight's
first dimension and on others: a per-client table is one row, whatever N is (#75)."""

import pytest

from tff_comp import models
from tff_comp.algorithms import afl, ditto, fedavg, qfedavg, scaffold
from tff_comp.ops import communication

D = 5
MODEL_FLOATS = D + 1  # kernel [5, 1] and bias [1]
F = 4  # bytes a float32


def _bytes(build, population: int) -> tuple[float, float]:
  return communication.client_bytes(build(models.linear_regression((D,)), population))


BUILDERS = {
  # upload: the model's delta; download: the model.
  'fedavg': (
    lambda m, n: fedavg.fedavg(m, client_learning_rate=0.1),
    MODEL_FLOATS,
    MODEL_FLOATS,
  ),
  # q-FFL: delta and the scalar h_i beside it; download: the model.
  'qfedavg': (
    lambda m, n: qfedavg.qfedavg(m, client_learning_rate=0.1),
    MODEL_FLOATS + 1,
    MODEL_FLOATS,
  ),
  # SCAFFOLD: delta, its new c_i (one row) and its 'visited' flag (one); download: the
  # model, the server control c and its own c_i.
  'scaffold': (
    lambda m, n: scaffold.scaffold(m, num_clients=n, client_learning_rate=0.1),
    MODEL_FLOATS + MODEL_FLOATS + 1,
    3 * MODEL_FLOATS,
  ),
  # Ditto: delta, its personal model (one row) and its flag; download: the global model
  # and its own personal model.
  'ditto': (
    lambda m, n: ditto.ditto(m, num_clients=n, client_learning_rate=0.1),
    MODEL_FLOATS + MODEL_FLOATS + 1,
    2 * MODEL_FLOATS,
  ),
  # AFL: delta and its loss (one slot); download: the model and its own weight lambda_i.
  'afl': (
    lambda m, n: afl.afl(m, num_clients=n, client_learning_rate=0.1),
    MODEL_FLOATS + 1,
    MODEL_FLOATS + 1,
  ),
}


@pytest.mark.parametrize('population', [4, D, 6, 50])
@pytest.mark.parametrize('name', list(BUILDERS))
def test_a_clients_bytes_are_its_messages_counted_by_hand(name, population):
  build, up, down = BUILDERS[name]
  assert _bytes(build, population) == (up * F, down * F)
