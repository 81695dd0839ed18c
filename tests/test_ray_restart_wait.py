"""The Ray driver waits for an actor Ray is restarting (`ActorUnavailableError`), at
setup and after a death, and says so once the wait is long; without a cluster: a fake
Ray module whose actor is unavailable for its first calls."""

import pytest
from ray import exceptions

from tff_comp.runtime.ray import rounds as ray_rounds


class _Actor:
  def __init__(self, name, calls):
    self.setup = self.restore = self
    self._name, self._calls = name, calls

  def remote(self, *args):
    self._calls.append((self._name, args))
    return self._name


class _Ray:
  """`get` raises ActorUnavailableError for the first `unavailable[name]` gets of an
  actor's calls, as Ray does while it restarts that actor."""

  exceptions = exceptions

  def __init__(self, unavailable):
    self.unavailable = dict(unavailable)

  def get(self, ref):
    if self.unavailable.get(ref, 0) > 0:
      self.unavailable[ref] -= 1
      raise exceptions.ActorUnavailableError('restarting', None)
    return ref


def _driver(unavailable, journal=()):
  calls = []
  driver = ray_rounds.RayRuntime.__new__(ray_rounds.RayRuntime)
  driver._ray = _Ray(unavailable)
  driver._actors = [_Actor('a0', calls), _Actor('a1', calls)]
  driver._setups = [('setup', 0), ('setup', 1)]
  driver._journal = [list(journal), []]
  return driver, calls


def test_setup_waits_for_an_actor_ray_is_still_restarting(monkeypatch, capsys):
  monkeypatch.setattr(ray_rounds.time, 'sleep', lambda seconds: None)
  driver, calls = _driver({'a1': 3})
  driver._set_up_all()
  assert calls.count(('a1', ('setup', 1))) == 4 and calls.count(('a0', ('setup', 0))) == 1
  assert capsys.readouterr().out == ''  # a short wait says nothing


def test_a_long_restart_is_said_once_and_the_rows_restored(monkeypatch, capsys):
  monkeypatch.setattr(ray_rounds.time, 'sleep', lambda seconds: None)
  monkeypatch.setattr(ray_rounds, 'RESTART_NOTICE', -1.0)
  driver, calls = _driver({'a0': 5}, journal=['rows'])
  driver._set_up_again(0)
  assert calls[-1] == ('a0', ('rows',))
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1 and out[0].startswith('ray: actor 0 is still restarting after'), out


def test_a_restart_past_the_wait_raises(monkeypatch):
  monkeypatch.setattr(ray_rounds.time, 'sleep', lambda seconds: None)
  monkeypatch.setattr(ray_rounds, 'RESTART_WAIT', -1.0)
  driver, _ = _driver({'a0': 1})
  with pytest.raises(exceptions.ActorUnavailableError):
    driver._set_up_again(0)
