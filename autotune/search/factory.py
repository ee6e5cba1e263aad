"""Which sampler a study runs, made from its config.

:func:`make_sampler` turns a config's ``sampler`` key (``tpe``, ``gp`` or ``random``) into an
Optuna sampler; :func:`for_space` binds it to a search space as a :data:`SamplerFactory`, the
form a driver takes: a function of the seed only. :func:`derived_seed` is the seed a resumed
study's sampler gets, so that it neither replays nor loses reproducibility.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import optuna

from autotune.config.space import SearchSpace
from autotune.search.prior import Prior
from autotune.search.samplers import CrashAwareTPESampler

SamplerFactory = Callable[[int | None], optuna.samplers.BaseSampler]
"""Makes a study's sampler from its seed (:func:`derived_seed`)."""


def derived_seed(seed: int | None, trials_so_far: int) -> int | None:
    """The sampler seed of an invocation that starts after ``trials_so_far`` trials.

    A resumed seeded study must not replay the sequence it already ran, and must stay
    reproducible: the seed depends on the configured seed and the history's length only.
    """
    if seed is None:
        return None
    return (seed * 1_000_003 + trials_so_far * 7_919) % 2**32


def make_sampler(kind: str, seed: int | None, *, slots: int = 1,
                 launched_as: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
                 monotone: Mapping[str, Mapping[str, str]] | None = None,
                 raise_when: Mapping[str, str] | None = None, prior: Prior | None = None) -> optuna.samplers.BaseSampler:
    """The sampler for a config's ``sampler`` key, for a study run on ``slots`` slots at once.

    Args:
        kind: ``gp`` (Optuna's ``GPSampler``), ``random`` (``RandomSampler``), else ``tpe``:
            :class:`~autotune.search.samplers.CrashAwareTPESampler` (multivariate TPE, constant liar
            and a shorter start-up with several slots, proposals redrawn out of regions where every
            trial crashed).
        seed: The sampler's seed (None: unseeded).
        slots: How many trials run at once.
        launched_as: What a proposal is launched as (the space's ``applied``), for ``tpe``.
        monotone: The space's monotone declarations: what ``tpe`` backs off along while no
            trial has run.
        raise_when: The parameters ``tpe`` raises when the best trial's scheduler log calls for
            it (:mod:`autotune.outcome.load_signals`).
        prior: What earlier studies found (a warm start), for ``tpe``; the other samplers start
            from the warm start's enqueued configurations only.

    Each runs multi-objective studies too: Optuna 5's TPE ranks trials by non-domination and every
    trial with a positive constraint below the feasible ones; the GP sampler has a constrained
    multi-objective acquisition.
    """
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return CrashAwareTPESampler(seed, slots=slots, launched_as=launched_as, monotone=monotone, raise_when=raise_when,
                                prior=prior)


def for_space(kind: str, space: SearchSpace, *, slots: int = 1, prior: Prior | None = None) -> SamplerFactory:
    """:func:`make_sampler` for ``kind`` on ``space`` (its ``applied``, ``monotone`` and
    ``raise_when``) with ``slots`` slots and ``prior``, as a function of the seed."""

    def factory(seed: int | None) -> optuna.samplers.BaseSampler:
        return make_sampler(kind, seed, slots=slots, launched_as=space.applied, monotone=space.monotone(),
                            raise_when=space.raise_when(), prior=prior)

    return factory
