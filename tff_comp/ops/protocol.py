"""Deprecated: renamed `tff_comp.ops.client_round` (CHANGELOG 0.2.0); kept for one
version."""

import warnings

from tff_comp.ops.client_round import *  # pylint: disable=wildcard-import,unused-wildcard-import

warnings.warn('tff_comp.ops.protocol is renamed tff_comp.ops.client_round.',
              DeprecationWarning, stacklevel=2)
