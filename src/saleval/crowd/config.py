"""The crowd config schemas' old address, kept for code that imports them from here.

They live in :mod:`saleval.config.crowd`, with the other schemas
(docs/architecture.md, section 4); import them from there.
"""

from __future__ import annotations

from saleval.config.crowd import (
    AgreementConfig,
    AnswersCrowdConfig,
    Decision,
    ExpertConfig,
    FiltersConfig,
    IdkAs,
    NoiseConfig,
    NoiseDistribution,
    PublishedCrowdConfig,
    ReaderConfig,
    SimulationConfig,
    SpammerKinds,
    SpammersConfig,
    StudyConfig,
    TimingConfig,
    register_schemas,
)

__all__ = [
    "AgreementConfig",
    "AnswersCrowdConfig",
    "Decision",
    "ExpertConfig",
    "FiltersConfig",
    "IdkAs",
    "NoiseConfig",
    "NoiseDistribution",
    "PublishedCrowdConfig",
    "ReaderConfig",
    "SimulationConfig",
    "SpammerKinds",
    "SpammersConfig",
    "StudyConfig",
    "TimingConfig",
    "register_schemas",
]
