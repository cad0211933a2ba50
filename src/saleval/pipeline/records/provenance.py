"""What a run's outputs *mean*, carried from stage to stage: declared once, one rule.

A run's provenance says which dataset (and label names) its rows belong to, which model
made them, the ``max_length`` its texts were segmented with, the crowd study's target and
population, and whether a simulated crowd answered anywhere upstream. ``run.json`` carries
it as a typed record (:class:`Provenance`), the way :mod:`saleval.pipeline.tables` declares tables.

The rule (:func:`inherit`) is the same in every stage (``docs/architecture.md``): a value
the stage's own config does not give is **adopted** from its parents; a value it gives is
**checked** against theirs; two parents that disagree, or a given value that differs from
a parent's, fail naming both values and where they came from. ``simulated`` is the one
exception: it is true when any parent (or the stage itself) says so, and cannot be unset.
``unfinished`` is sticky the same way: the runs read although they had not finished
(``allow_unfinished_inputs=true``, :mod:`saleval.pipeline.records.run_record`) stay named in every
run downstream of them.

>>> a = Provenance(dataset="imdb", label_names=("negative", "positive"))
>>> inherit("dataset", None, {"explain": a}, {"explain": "runs/e"})
'imdb'
>>> inherit("dataset", "ag_news", {"explain": a}, {"explain": "runs/e"})
Traceback (most recent call last):
...
saleval.pipeline.records.provenance.ProvenanceError: dataset=ag_news is given, but inputs.explain (runs/e) has dataset=imdb: drop the override or pass dataset=imdb
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from saleval.config import DatasetConfig
from saleval.errors import UserError
from saleval.vocab import Population, Target


class ProvenanceError(UserError, ValueError):
    """Runs that are chained together describe different data, models or studies."""


@dataclass(frozen=True)
class Provenance:
    """The meaning of a run's outputs, inherited by every run downstream of it."""

    #: the dataset config's ``name`` and its label names, in class-index order
    dataset: str | None = None
    label_names: tuple[str, ...] | None = None
    #: the model config's ``name`` (a train run's model, or a given checkpoint's)
    model: str | None = None
    #: the token limit the explained texts were segmented with (words cut by it are dropped)
    max_length: int | None = None
    #: the crowd study: what workers name (gold label or the model's prediction)...
    target: Target | None = None
    #: ...and which samples it draws (by the model's outcome)
    population: Population | None = None
    #: a simulated crowd answered somewhere upstream: every table and plot must say so
    simulated: bool = False
    #: runs read although they had not FINISHED (``allow_unfinished_inputs=true``), here or
    #: upstream, as ``<run dir> (<status>)``: their tables may be partial
    unfinished: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["label_names"] = None if self.label_names is None else list(self.label_names)
        out["unfinished"] = list(self.unfinished)
        for key in ("target", "population"):
            out[key] = None if out[key] is None else str(out[key])
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Provenance:
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ProvenanceError(f"run.json provenance has unknown field(s) {sorted(unknown)}")
        labels = data.get("label_names")
        return cls(
            dataset=_opt_str(data.get("dataset")),
            label_names=None if labels is None else tuple(str(n) for n in labels),
            model=_opt_str(data.get("model")),
            max_length=None if data.get("max_length") is None else int(data["max_length"]),
            target=None if data.get("target") is None else Target(data["target"]),
            population=None if data.get("population") is None else Population(data["population"]),
            simulated=bool(data.get("simulated", False)),
            unfinished=tuple(str(r) for r in data.get("unfinished") or ()),
        )

    @classmethod
    def from_config(cls, cfg: DictConfig | None) -> Provenance:
        """The values a stage's own composed config gives (``None`` where it gives none)."""
        if cfg is None:
            return cls()

        def pick(key: str) -> Any:
            return OmegaConf.select(cfg, key, default=None, throw_on_missing=False)

        labels = pick("dataset.label_names")
        target = pick("study.target")
        population = pick("study.population")
        return cls(
            dataset=_opt_str(pick("dataset.name")),
            label_names=None if labels is None else tuple(str(n) for n in labels),
            model=_opt_str(pick("model.name")),
            max_length=None if pick("model.max_length") is None else int(pick("model.max_length")),
            target=None if target is None else Target(str(target)),
            population=None if population is None else Population(str(population)),
        )

    @classmethod
    def of_run(
        cls,
        run_dir: str | Path,
        recorded: Provenance | None,
        simulated: bool,
        cfg: DictConfig | None = None,
    ) -> Provenance:
        """A parent's provenance: what its record holds (``recorded``: the ``provenance`` of
        its :class:`~saleval.pipeline.records.run_record.RunRecord`), or (runs recorded before the
        field existed) what its ``config.yaml`` (``cfg`` when already read) says, with the
        record's ``simulated``."""
        if recorded is not None:
            return recorded
        if cfg is None:
            path = Path(run_dir, "config.yaml")
            loaded = OmegaConf.load(path) if path.is_file() else None
            cfg = loaded if isinstance(loaded, DictConfig) else None
        own = cls.from_config(cfg)
        explain_len = None if cfg is None else OmegaConf.select(cfg, "max_length", default=None)
        return dataclasses.replace(
            own,
            max_length=int(explain_len) if explain_len else own.max_length,
            simulated=simulated,
        )


#: the fields the rule applies to; ``label_names`` travels with ``dataset``
FIELDS: tuple[str, ...] = ("dataset", "model", "max_length", "target", "population")


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _show(field: str, value: Any, labels: Sequence[str] | None = None) -> str:
    """``dataset=imdb (labels negative, positive)``, ``max_length=256``."""
    shown = f"{field}={value}"
    return shown + (f" (labels {', '.join(labels)})" if labels is not None else "")


def inherit(
    field: str,
    given: Any,
    parents: Mapping[str, Provenance],
    where: Mapping[str, str | Path],
    given_labels: Sequence[str] | None = None,
) -> Any:
    """The one provenance rule: adopt the parents' value, or check a given one against it.

    ``parents`` maps input names to their records (only those the stage takes ``field``
    from); ``where`` names each input's run dir for the error message. For ``dataset``
    the label names must agree too (``given_labels``).
    """
    if field not in FIELDS:
        raise ValueError(f"{field!r} is not a provenance field; one of {FIELDS}")
    known = {name: p for name, p in parents.items() if getattr(p, field) is not None}
    values = {name: (getattr(p, field), p.label_names if field == "dataset" else None)
              for name, p in known.items()}  # fmt: skip
    label_sets = {v[1] for v in values.values() if v[1] is not None}
    if len({v[0] for v in values.values()}) > 1 or len(label_sets) > 1:
        shown = "; ".join(f"inputs.{n} ({where[n]}) has {_show(field, *values[n])}"
                          for n in known)  # fmt: skip
        raise ProvenanceError(f"the inputs disagree on {field}: {shown}")
    if not known:
        return given
    name, theirs = next(iter(known.items()))
    value = getattr(theirs, field)
    if given is None:
        return value
    labels_differ = (
        field == "dataset"
        and str(given) == str(value)
        and given_labels is not None
        and theirs.label_names is not None
        and tuple(str(n) for n in given_labels) != theirs.label_names
    )
    if str(given) != str(value) or labels_differ:
        ours = _show(field, given, given_labels if labels_differ else None)
        raise ProvenanceError(
            f"{ours} is given, but inputs.{name} ({where[name]}) has "
            f"{_show(field, value, theirs.label_names if labels_differ else None)}: "
            f"drop the override or pass {field}={value}"
        )
    return given


def resolve(
    own: Provenance,
    parents: Mapping[str, Provenance],
    where: Mapping[str, str | Path],
    inherits: Mapping[str, Sequence[str]] | Sequence[str] | None = None,
) -> Provenance:
    """Apply :func:`inherit` to every field a stage inherits; the rest are its own.

    ``inherits``: field names (taken from every parent), or a mapping from a field to the
    input names it is taken from (e.g. the metrics stage takes ``max_length`` from its
    explain run, not from the train run whose setting the explain run may override).
    ``None``: every field, from every parent.
    """
    if inherits is None:
        sources: dict[str, Sequence[str]] = {f: list(parents) for f in FIELDS}
    elif isinstance(inherits, Mapping):
        sources = {f: list(names) for f, names in inherits.items()}
    else:
        sources = {f: list(parents) for f in inherits}
    unknown = set(sources) - set(FIELDS)
    if unknown:
        raise ValueError(f"cannot inherit {sorted(unknown)}: provenance fields are {FIELDS}")
    values: dict[str, Any] = {f: getattr(own, f) for f in FIELDS}
    labels = own.label_names
    for field, names in sources.items():
        chosen = {n: parents[n] for n in names if n in parents}
        values[field] = inherit(field, getattr(own, field), chosen, where, own.label_names)
        if field == "dataset" and own.dataset is None:
            labels = next(
                (p.label_names for p in chosen.values() if p.dataset == values["dataset"]), None
            )
    return Provenance(
        **values,
        label_names=labels,
        simulated=own.simulated or any(p.simulated for p in parents.values()),
        unfinished=tuple(
            dict.fromkeys([*own.unfinished, *(r for p in parents.values() for r in p.unfinished)])
        ),
    )


def of_run(
    cfg: DictConfig,
    parents: Mapping[str, Provenance],
    where: Mapping[str, str | Path],
    inherits: Mapping[str, Sequence[str]] | Sequence[str] | None,
    simulated: bool = False,
    unfinished: tuple[str, ...] = (),
) -> Provenance:
    """A stage run's provenance: what ``cfg`` gives, then :func:`resolve` over its parent
    runs (``parents`` and ``where`` by run label); ``simulated`` marks a run that is
    simulated whatever its parents say, ``unfinished`` the parents read unfinished."""
    own = dataclasses.replace(Provenance.from_config(cfg), unfinished=unfinished)
    out = resolve(own, parents, where, inherits)
    return dataclasses.replace(out, simulated=True) if simulated else out


def require(
    provenance: Provenance, stage: str, requires: Sequence[str], inputs: Mapping[str, Path]
) -> None:
    """Fail before the run starts when a field in ``requires`` is neither given nor
    adopted from ``inputs`` (input name → run dir), naming what to pass."""
    unknown = [f for f in requires if getattr(provenance, f) is None]
    if unknown:
        where = ", ".join(f"inputs.{k}={p}" for k, p in inputs.items()) or "no inputs"
        raise ProvenanceError(
            f"saleval-{stage}: no {' or '.join(unknown)} is given and none is recorded by "
            f"{where}; pass " + " ".join(f"{f}=<name>" for f in unknown)
        )


def adopt_dataset(cfg: DictConfig, name: str | None, parents: Mapping[str, DictConfig]) -> None:
    """A dataset ``name`` adopted from a parent comes with its whole config node (files,
    label descriptions...), read from that parent's ``config.yaml`` (``parents``) into
    ``cfg``, so the stage loads the data its parents used; a dataset ``cfg`` gives is kept."""
    if name is None or OmegaConf.select(cfg, "dataset", default=None) is not None:
        return
    for parent in parents.values():
        node = OmegaConf.select(parent, "dataset", default=None)
        if node is not None and str(node.get("name")) == name:
            plain = OmegaConf.to_container(node, resolve=False)
            assert isinstance(plain, dict)
            # the shared data root is re-pointed to where it sits here; a data_root
            # of the user's own (docs/own-data.md) is kept as recorded
            shared = OmegaConf.select(parent, "paths.data_root", default=None)
            if OmegaConf.select(cfg, "paths.data_root", default=None) is not None and (
                shared is None or str(plain.get("data_root")) == str(shared)
            ):
                plain["data_root"] = "${paths.data_root}"
            try:  # typed: a recorded node is checked against today's schema
                typed = OmegaConf.merge(OmegaConf.structured(DatasetConfig), plain)
            except Exception as err:
                raise ProvenanceError(
                    f"the dataset config recorded by an input run cannot be read with "
                    f"this version of saleval ({err}); pass dataset={name}"
                ) from err
            with open_dict(cfg):
                cfg.dataset = typed
            return
    raise ProvenanceError(
        f"the inputs are about dataset {name!r} but none of their config.yaml files holds "
        f"its config; pass dataset={name}"
    )
