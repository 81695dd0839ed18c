# A partial stub of TensorFlow Federated (which ships no types) for mypy: its aggregation
# factories are classes, so that a block chain passed where TFF's factory is annotated
# is an error (tests/type_contracts.py); every other name is Any, as without a stub.
from typing import Any

from tensorflow_federated import aggregators as aggregators

def __getattr__(name: str) -> Any: ...
