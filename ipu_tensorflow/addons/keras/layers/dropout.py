"""``Dropout``: the IPU dropout layer (AD ``keras/layers/dropout.py``) as tf-keras' Dropout."""

from __future__ import annotations

import numbers

import tf_keras

__all__ = ["Dropout"]


def _int_seed(seed) -> int | None:
    """The add-on's seed pair ``[2]`` (TF-IPU's ``rand_ops.dropout``) as the one int seed
    stock Dropout takes: ``s0 * 2**31 + s1`` folded into 31 bits (ipupod assumption: any
    fixed map serves; the IPU's random stream differs anyway)."""
    if seed is None:
        return None
    if isinstance(seed, numbers.Integral):
        return int(seed)
    values = [int(s) for s in seed]
    if len(values) != 2:
        raise ValueError(f"Dropout: seed must be a pair of ints (shape [2]), got {seed!r}")
    return (values[0] * 2**31 + values[1]) % 2**31


class Dropout(tf_keras.layers.Dropout):
    """Dropout optimised for the IPU: ``Dropout(rate, noise_shape=None, seed=None)``.

    Input and output: any shape, float. In training each element is zeroed with probability
    ``rate`` and the survivors scaled by ``1 / (1 - rate)``; at inference the identity.

    Differences from the IPU layer (reference §7): the scaling and the inference identity are
    the same; the masks differ (the IPU draws from its own generator; here tf-keras' stateless
    RNG). ``seed`` is the add-on's pair ``[2]`` (an int is also accepted), folded into the
    one int stock Dropout takes. ``get_config`` returns the add-on's keys only (rate,
    noise_shape, seed), as the add-on does.

    Raises:
        ValueError: "The rate must be in the range [0, 1), but was <rate>" (TF-IPU
            ``rand_ops.dropout``); a seed that is not a pair.
    """

    def __init__(self, rate, noise_shape=None, seed=None, **kwargs):
        if not 0 <= float(rate) < 1:
            raise ValueError(f"The rate must be in the range [0, 1), but was {rate}")
        self._ipu_seed = seed
        super().__init__(rate, noise_shape=noise_shape, seed=_int_seed(seed), **kwargs)

    def get_config(self):
        return {"rate": self.rate, "noise_shape": self.noise_shape, "seed": self._ipu_seed}
