"""`runner template slurm job.yaml`: an sbatch script that runs one runner agent per node with srun."""

from __future__ import annotations

import math
from pathlib import PurePath

from runner.config.clusters.common import check_etcd, environment, member_count, problem, provides_secret
from runner.config.clusters.fit import Fit, fit
from runner.config.spec import JobSpec
from runner.config.timeout_order import SLURM_GRACE


def slurm_time(seconds: float) -> str:
    """Seconds -> sbatch --time 'D-HH:MM:SS' (rounded up to whole seconds)."""
    total = math.ceil(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


def check(spec: JobSpec, spec_path: str) -> None:
    """Settings that would make the script wrong rather than merely different."""
    if SLURM_GRACE.broken(spec):  # `runner validate` checks it only on a spec with cluster.slurm; any spec here
        raise problem(spec_path, "cluster.slurm.signal_lead", SLURM_GRACE.message(spec), SLURM_GRACE.fix)
    check_etcd(spec, spec_path)


def kill_on_bad_exit(spec: JobSpec) -> tuple[int, str]:
    """1 for a fixed-size job (a node that gave up cannot be replaced: end the step); 0 when elastic."""
    if spec.nodes.min < spec.nodes.max:
        return 0, "elastic job: the other agents handle a lost node (rendezvous, restart policy)"
    return 1, "fixed size: an agent that gave up (or lost its node) ends the step at once"


def sbatch_script(spec: JobSpec, spec_path: str, fitted: Fit | None = None) -> str:
    """The sbatch script text; `fitted`: what the template changes (None: worked out from `spec` alone)."""
    check(spec, spec_path)
    fitted = fitted or fit("slurm", spec, None, spec_path)
    slurm, cluster = spec.cluster.slurm, spec.cluster
    kill, kill_reason = kill_on_bad_exit(spec)
    nodes = f"{spec.nodes.min}" if spec.nodes.min == spec.nodes.max else f"{spec.nodes.min}-{spec.nodes.max}"
    text: str = environment().get_template("slurm.sbatch.j2").render(
        name=spec.name,
        spec_path=spec_path,
        script_name=f"{PurePath(spec_path).stem}.sbatch",
        nodes=nodes,
        elastic=spec.nodes.min < spec.nodes.max,
        cpus_per_node=slurm.cpus_per_node,
        gpus_per_node=fitted.gpus_per_node,
        hosted_port=fitted.hosted_port,
        fixed_endpoints=", ".join(spec.rendezvous.endpoints),
        partition=slurm.partition,
        account=slurm.account,
        time_limit=slurm_time(slurm.time_limit) if slurm.time_limit else None,
        signal_lead=math.ceil(slurm.signal_lead),
        requeue=slurm.requeue,
        output="slurm-%x-%j.out",  # in the submit folder: Slurm does not create folders for it
        sbatch_args=slurm.sbatch_args,
        start_etcd=cluster.etcd == "start",
        job_secret=provides_secret(spec),
        hosted_members=member_count(spec) if spec.rendezvous.hosted else 0,
        agents_step=1 if cluster.etcd == "start" else 0,  # step ids count srun calls: etcd's comes first
        etcd_command=slurm.etcd_command,
        etcd_port=cluster.etcd_port,
        etcd_peer_port=cluster.etcd_port + 1,
        stop_signal=spec.shutdown.signal,
        grace_period=f"{spec.shutdown.grace_period:g}",
        kill_on_bad_exit=kill,
        kill_reason=kill_reason,
    )
    return text
