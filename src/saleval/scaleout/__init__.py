"""Running sweeps on other engines than one process (docs/scale-out.md).

* :mod:`saleval.scaleout.slurm`: the ``hydra/launcher=slurm`` launcher, Submitit's with a
  check of the job's resources against the partition before anything is submitted, a wait
  that notices a cancelled job, and resubmission that reruns only unfinished jobs;
* :mod:`saleval.scaleout.ray`: the ``hydra/launcher=ray`` launcher on Ray's public API;
* :mod:`saleval.scaleout.resume`: which jobs of a sweep dir already finished;
* :mod:`saleval.scaleout.slurm_local`: a one-node SLURM cluster on this machine (the tests,
  ``make slurm-local``), to try a cluster config before the real cluster.
"""
