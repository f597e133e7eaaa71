"""The crawl YAML's `train:` stage as a Slurm batch job after the tokenize stage.

One `srun` task per node runs torchrun: `--standalone` on one node, a c10d rendezvous on the
first node of the allocation for several. Preemption: Slurm sends SIGUSR1 to the batch shell
(`--signal=B:USR1@<grace>`); its trap creates the preemption file, the trainer writes a
checkpoint at the end of the current step and exits, and the job requeues itself. A requeued or
resubmitted job resumes from the latest checkpoint in `<run_dir>/train/checkpoints`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from gristmill.config import RunConfig
from gristmill.pipeline.execution.executors import default_venv_activate
from gristmill.trainer.launch import PREEMPT_ENV, default_nproc, pipeline_train_config, write_resolved


def train_script(cfg: RunConfig, run_dir: Path, depends_on: str | None) -> str:
    slurm, section = cfg.executor.slurm, cfg.train
    over = slurm.stages.get("train")
    train_cfg = pipeline_train_config(section, run_dir)
    out = run_dir / "train"
    resolved = write_resolved(train_cfg, out)
    nodes = section.nodes
    nproc = section.nproc or default_nproc(train_cfg)
    cpus = (over and over.cpus_per_task) or max(slurm.cpus_per_task, nproc if not section.gpus_per_node else 1)
    mem_gb = (over and over.mem_per_cpu_gb) or slurm.mem_per_cpu_gb
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={slurm.job_name_prefix}-train",
        f"#SBATCH --partition={slurm.partition}",
        f"#SBATCH --time={(over and over.time) or slurm.time}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --mem-per-cpu={int(mem_gb * 1024)}M",
        f"#SBATCH --output={out}/slurm-%j.out",
        "#SBATCH --open-mode=append",  # a requeued job keeps what it logged before
        f"#SBATCH --signal=B:USR1@{section.preempt_grace_s}",
        "#SBATCH --requeue",
    ]
    if section.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={section.gpus_per_node}")
    if slurm.qos:
        lines.append(f"#SBATCH --qos={slurm.qos}")
    if slurm.account:
        lines.append(f"#SBATCH --account={slurm.account}")
    for key, value in slurm.sbatch_args.items():
        lines.append(f"#SBATCH --{key}={value}" if value else f"#SBATCH --{key}")
    if depends_on:
        lines.append(f"#SBATCH --dependency=afterok:{depends_on}")
    env = slurm.env_command or (
        f"source {shlex.quote(slurm.venv_path or default_venv_activate() or '')}"
        if (slurm.venv_path or default_venv_activate())
        else ""
    )
    preempt = out / "PREEMPT"
    python = shlex.quote(sys.executable)
    torchrun = (
        f"{python} -m gristmill.trainer.torchrun --nnodes=$SLURM_NNODES --nproc-per-node={nproc}"
        " --rdzv-backend=c10d --rdzv-endpoint=$HEAD:29500 --rdzv-id=$SLURM_JOB_ID"
        if nodes > 1
        else f"{python} -m gristmill.trainer.torchrun --standalone --nproc-per-node={nproc}"
    )
    lines += [
        env,
        "set -u",
        f"export {PREEMPT_ENV}={shlex.quote(str(preempt))}",
        f"rm -f {shlex.quote(str(preempt))}",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-" + str(max(1, cpus // nproc)) + "}",
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'echo "train job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on $SLURM_JOB_NODELIST"',
        # the trap runs when the shell is in `wait`: ask for a checkpoint, let training write it, requeue
        f'trap \'echo "SIGUSR1: checkpoint and requeue"; touch {shlex.quote(str(preempt))}; wait $PID;'
        " scontrol requeue $SLURM_JOB_ID; exit 0' USR1",
        f"srun --kill-on-bad-exit=1 {torchrun} -m gristmill.trainer.train {shlex.quote(str(resolved))}"
        f" --out {shlex.quote(str(out))} &",
        "PID=$!",
        "wait $PID",
        "exit $?",
    ]
    return "\n".join(lines) + "\n"


def submit_training(cfg: RunConfig, run_dir: Path, depends_on: str | None) -> str:
    script = train_script(cfg, run_dir, depends_on)
    path = run_dir / "train" / "train_job.slurm"
    path.write_text(script)
    out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch {path} failed: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]
