"""``saleval-simulate``: a SIMULATED crowd answers a task run's bundles
(docs/study-design.md#simulated-crowd, docs/architecture.md).

Reads ``tasks.csv`` and ``bundles.csv`` of ``inputs.tasks``; writes ``answers.csv``
(the import format, ``simulated=true`` on every row), ``workers.csv`` (who was a
spammer, each worker's noise rate) and ``SIMULATED.md``. The MLflow run is tagged
``simulated=true``; ``run.json`` carries it so every child run inherits it.

Main options: ``inputs.tasks``, ``simulation`` (default, ideal, noisy), ``seed``.

Example::

    saleval-simulate inputs.tasks=latest simulation=noisy
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from saleval import tables
from saleval.crowd.config import SimulationConfig
from saleval.crowd.simulate import simulate_crowd
from saleval.data import load_dataset
from saleval.schema import to_schema
from saleval.stage import Stage, hydra_main

NOTICE = """# SIMULATED

The answers in this run were produced by simulated workers (`saleval-simulate`), not by
people. A bag-of-words model trained on the `{split}` split of `{dataset}` stands in for
reading; workers lapse at their own noise rate, answer "I don't know" when unsure, and
{n_spam} of {n_workers} are spammers (see `workers.csv`). Use them to test the pipeline,
never as evidence about how people judge explanations.
"""


def run(cfg: DictConfig) -> dict[str, Any]:
    inputs = {"tasks": cfg.inputs.tasks}
    tags = {"simulated": "true"}
    with Stage(cfg, "simulate", inputs, tags=tags, requires=["dataset"]) as st:
        task_dir = st.inputs["tasks"]
        tasks = tables.TASKS.read(task_dir)
        bundles = tables.BUNDLES.read(task_dir)
        st.log_methods(list(dict.fromkeys(tasks["method"].astype(str))))
        sim = to_schema(SimulationConfig, cfg.simulation)
        data = load_dataset(cfg.dataset)
        labels = [str(n) for n in cfg.dataset.label_names]
        crowd = simulate_crowd(tasks, bundles, data[sim.bow.split], labels, sim)
        st.write(tables.ANSWERS, crowd.answers)
        crowd.workers.to_csv(st.path("workers.csv"), index=False)
        st.path("SIMULATED.md").write_text(
            NOTICE.format(
                split=sim.bow.split,
                dataset=cfg.dataset.name,
                n_spam=int(crowd.summary["sim_n_spammers"]),
                n_workers=int(crowd.summary["sim_n_workers"]),
            )
        )
        st.log_file(st.path("workers.csv"))
        st.log_file(st.path("SIMULATED.md"))
        st.log_metrics(crowd.summary)
        return {"run_dir": str(st.run_dir), "run_id": st.run_id, **crowd.summary}


main = hydra_main("simulate", run)
