"""Fault-tolerant training with TorchFT: a character-level transformer on the CPU (gloo), no checkpoint files.

    runner examples/jobs/ft_train.yaml          # 2 replica groups of 1 worker each (needs `pip install runner[ft]`)

Each replica group is its own world (RANK/WORLD_SIZE within the group, its own store); the groups average their
gradients through TorchFT's Manager, which asks the lighthouse ($TORCHFT_LIGHTHOUSE) every step which groups take
part. When a group dies, the others leave it out of the next quorum and keep stepping; when it comes back, it
copies the weights and optimizer state from a live peer (no checkpoint file) and steps with them again.

What it reads (runner sets these for every group's workers, on top of torchrun's RANK, WORLD_SIZE, MASTER_*):
TORCHFT_LIGHTHOUSE, REPLICA_GROUP_ID (0..N-1), NUM_REPLICA_GROUPS (N), TORCHFT_MANAGER_PORT, RUNNER_HEARTBEAT_FILE.

What it prints (one line each, key=value, so that tests and bench/goodput.py parse it; `start` from every worker,
the others from each group's rank 0):
    ft_train start mode=ft group=0 groups=2 rank=0 world=1 pid=123 attempt=0 params=109610 time=<epoch s>
    ft_train step mode=ft group=0 step=41 commit=1 groups=2 samples=32 loss=2.3012 time=<epoch s>
    ft_train heal group=0 step=2 pid=123 time=<epoch s>     (ft: the group copied a live peer's weights)
    ft_train params group=0 step=300 params_sha=<sha256 of the parameters' bytes>    (SIGUSR1, or --sha-every)
    ft_train final group=0 step=300 params_sha=<...>
    ft_train ckpt group=0 step=200 seconds=0.0412 bytes=21904567 time=<epoch s>      (--mode ddp, rank 0)
`step` is the committed step (TorchFT's manager.current_step() after the step; unchanged with commit=0), `groups`
the replica groups whose gradients the step averaged, `samples` the samples it committed (groups x per-group batch,
0 when not committed). `--log-every N` prints one `step` line in N (default 1: every one), and always the
first, the last, a dropped one (commit=0) and one whose `groups` differs from the line before: the lines that tell
a failure and a recovery. After each committed step, group rank 0 writes {"step": S, "loss": L} to
$RUNNER_HEARTBEAT_FILE (atomically), which is how runner learns the group's progress; it is also a heartbeat.

`--mode ddp` runs the same model and data as a plain torch DDP job over all WORLD_SIZE workers instead, with a
checkpoint every --ckpt-every steps that every attempt resumes from (the whole-job-restart baseline of
bench/goodput.py). Both modes use the same global batch (--global-batch sequences): per worker global/WORLD, where
in ft mode WORLD counts every group's workers (NUM_REPLICA_GROUPS x the group's WORLD_SIZE).

What it does not print: four messages of TorchFT and torch that say nothing about this run (quiet_known_noise and
spend_ddp_unused_notice below; docs/replica_groups.md, "What the examples do not print"). Each filter matches one
message; every other line of torch, TorchFT and this script reaches the worker's output.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import os
import random
import signal
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

SHA_REQUESTED = False  # set by SIGUSR1: print the parameters' checksum at the next step boundary


# ---------------------------------------------------------------------------------------------------------------
# Data: a deterministic corpus (or --text FILE), random windows drawn from a generator seeded by (step, worker).

WORDS = {
    "name": ["Ada", "the miller", "old Tom", "the ferryman", "a young clerk", "the baker's wife", "Captain Reed",
             "the shepherd", "a tired soldier", "the widow Hale", "the schoolmaster", "little Nell"],
    "verb": ["carried", "found", "mended", "sold", "lost", "painted", "counted", "hid", "watched", "borrowed",
             "remembered", "buried", "weighed", "followed"],
    "thing": ["a lantern", "the silver key", "seven apples", "an old map", "the broken clock", "a bag of flour",
              "the letter", "two brown hens", "a wooden boat", "the red coat", "a loaf of bread", "the last coin"],
    "place": ["by the river", "in the market", "under the bridge", "at the inn", "on the hill", "behind the mill",
              "near the church", "in the cold cellar", "along the harbour wall", "at the edge of the wood"],
    "time": ["at dawn", "before supper", "in the rain", "on Sunday", "late at night", "in the spring",
             "when the bells rang", "after the storm"],
    "feeling": ["glad", "afraid", "tired", "proud", "sorry", "curious", "angry", "silent"],
}
TEMPLATES = [
    "{name} {verb} {thing} {place}.",
    "{time}, {name} {verb} {thing}.",
    "{name} was {feeling}, for {name2} had {verb} {thing} {place}.",
    '"Who {verb} {thing}?" asked {name}. "{Name2} did," said {name3}, "{time}."',
    "{name} and {name2} {verb} {thing} {place} {time}.",
    "Nobody {verb} {thing} {place}; {name} was {feeling}.",
]


def make_text(n_chars: int = 48_000, seed: int = 1) -> str:
    """A deterministic corpus of short story-like sentences (the same bytes on every machine and Python 3.x)."""
    rnd = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        para = []
        for _ in range(rnd.randint(2, 5)):
            fill = {k: rnd.choice(v) for k, v in WORDS.items()}
            fill["name2"], fill["name3"] = rnd.choice(WORDS["name"]), rnd.choice(WORDS["name"])
            fill["Name2"] = fill["name2"][0].upper() + fill["name2"][1:]
            s = rnd.choice(TEMPLATES).format(**fill)
            para.append(s[0].upper() + s[1:])
        text = " ".join(para) + "\n\n"
        out.append(text)
        size += len(text)
    return "".join(out)


class Corpus:
    """Characters as indices; batches of random windows, the same for a given (step, worker) on every run."""

    def __init__(self, text: str, block: int, seed: int) -> None:
        self.chars = sorted(set(text))
        index = {c: i for i, c in enumerate(self.chars)}
        self.data = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.block = block
        self.seed = seed

    def batch(self, step: int, worker: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`size` windows of `block` characters and their next characters."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 4099 + worker)
        starts = torch.randint(0, len(self.data) - self.block - 1, (size,), generator=g)
        offsets = torch.arange(self.block)
        x = self.data[starts[:, None] + offsets]
        y = self.data[starts[:, None] + offsets + 1]
        return x, y


# ---------------------------------------------------------------------------------------------------------------
# Model: a small GPT-style decoder.

class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, block: int, d: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(block, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1])
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def params_sha(model: nn.Module) -> str:
    """sha256 over every parameter's bytes, in the module's order: equal weights, equal checksum."""
    h = hashlib.sha256()
    for p in model.parameters():
        raw = p.detach().contiguous().view(torch.uint8).flatten()
        try:
            h.update(raw.numpy().tobytes())
        except RuntimeError:  # torch without numpy: slower, the same bytes
            h.update(bytes(raw.tolist()))
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------------------
# Reporting.

def report_step(step: int, loss: float) -> None:
    """Tell runner this group committed `step`: {"step", "loss"} in $RUNNER_HEARTBEAT_FILE, replaced atomically."""
    path = os.environ.get("RUNNER_HEARTBEAT_FILE")
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"  # same folder, so os.replace is a rename
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass  # a full or vanished logs dir must not stop training


def say(what: str, **fields: object) -> None:
    """One line in one write: workers sharing a stdout (torchrun's) never cut into each other's lines."""
    sys.stdout.write(f"ft_train {what} " + " ".join(f"{k}={v}" for k, v in fields.items()) + "\n")
    sys.stdout.flush()


def pin_cpus(spec: str, group: int) -> None:
    """Pin this worker to group `group`'s CPUs: the group-th of the '|'-separated lists in `spec` ("0|1": group 0 on
    CPU 0, group 1 on CPU 1; one list: every group on it). Nothing when `spec` is empty. bench/goodput.py uses it so
    that a surviving group cannot speed up on the cores of a group that died."""
    if not spec:
        return
    lists = spec.split("|")
    cpus = {int(c) for c in lists[group % len(lists)].split(",") if c}
    os.sched_setaffinity(0, cpus)


def on_sigusr1(_signum: int, _frame: object) -> None:
    global SHA_REQUESTED  # noqa: PLW0603 - a signal handler can only set a flag
    SHA_REQUESTED = True


def log_every(text: str) -> int:
    """--log-every: a whole number of steps, at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (1 prints every step), not {n}")
    return n


class StepLines:
    """Which `step` lines to print: one in `every`, and always the first, the last, a dropped step and a change in
    the number of groups that stepped (a group died or came back), so that a quiet log still tells every failure."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.groups: int | None = None  # `groups` of the step before (None: no step yet in this process)

    def wanted(self, step: int, *, committed: bool, groups: int, last: bool) -> bool:
        first, changed = self.groups is None, groups != self.groups
        self.groups = groups
        return self.every == 1 or first or changed or last or not committed or step % self.every == 0

    def say(self, *, step: int, commit: int, groups: int, last: bool, **fields: object) -> None:
        """The `step` line, when wanted."""
        if self.wanted(step, committed=bool(commit), groups=groups, last=last):
            say("step", mode=fields.pop("mode"), group=fields.pop("group"), step=step, commit=commit, groups=groups,
                **fields)


class Heals:
    """How often the Manager loaded a live peer's state into this process (the group healed), and a `heal` line
    for each (the Manager loads it from its own thread; the training loop prints)."""

    def __init__(self) -> None:
        self.loaded = 0
        self.said = 0

    def say_new(self, group: int, step: int) -> None:
        if self.loaded != self.said:
            self.said = self.loaded
            say("heal", group=group, step=step, pid=os.getpid(), time=f"{time.time():.3f}")


HEALS = Heals()


# ---------------------------------------------------------------------------------------------------------------
# Known noise: what TorchFT and torch print here that says nothing about this run, turned off one message at a time.

class DropMessage(logging.Filter):
    """Drops the records whose message contains `needle`; every other record passes."""

    def __init__(self, needle: str) -> None:
        super().__init__()
        self.needle = needle

    def filter(self, record: logging.LogRecord) -> bool:
        return self.needle not in record.getMessage()


def quiet_known_noise() -> None:
    """Three messages of TorchFT and torch that this job's user can do nothing about (docs/replica_groups.md), and
    TorchFT's Rust side's info logs (a line per quorum; its warnings and errors still show). Before TorchFT starts."""
    os.environ.setdefault("RUST_LOG", "warn")
    # TorchFT's Manager warns at every new quorum "Unable to reset NCCL flight recorder recording so traces will be
    # incorrect": torch has no NCCL here (the CPU build, gloo), so there is no NCCL trace to be incorrect.
    if not torch.cuda.is_available():
        logging.getLogger("torchft.manager").addFilter(DropMessage("Unable to reset NCCL flight recorder"))
    # A recovering group receives the peer's state in read-only bytes, and torch warns once that the tensors over
    # them are not writable. This script copies them before anything writes them (load_state_dict in make_manager:
    # the model's load copies, the optimizer's state is deep-copied first), so the warning is about nothing here.
    warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
    # TorchFT serves its state to a recovering peer with the standard library's http.server, which writes an access
    # line per request to stderr ('"GET /checkpoint/2/full HTTP/1.1" 200 -'). The recovering group prints its own
    # `ft_train heal` line instead; a request that fails (4xx, 5xx) is still logged, with its error.
    plain_log_request = BaseHTTPRequestHandler.log_request

    def log_request(handler: BaseHTTPRequestHandler, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, int) and code < 400 and handler.path.startswith("/checkpoint/"):
            return
        plain_log_request(handler, code, size)

    BaseHTTPRequestHandler.log_request = log_request  # type: ignore[method-assign]


DDP_UNUSED_NOTICE = b"find_unused_parameters=True was specified in DDP constructor"


def spend_ddp_unused_notice() -> None:
    """Spend torch's once-per-process DDP notice "find_unused_parameters=True was specified in DDP constructor, but
    did not find any unused parameters ... consider turning this flag off" on a throwaway module, before TorchFT's
    DDP would print it at the first step.

    The advice does not apply: TorchFT's DDP sets find_unused_parameters=True on purpose and allows no other value
    (it keeps DDP from rebuilding its gradient buckets after the first step, which a recovering group would do at
    another step than the others, averaging mismatched buffers). The notice is C++ (torch's reducer, written to
    stderr, no Python warning to filter), so this one forward of a one-parameter DDP runs with stderr caught in a
    file, before any other thread of TorchFT exists, and everything caught except that notice is written back."""
    from torchft.process_group import ProcessGroupDummy

    probe = nn.parallel.DistributedDataParallel(nn.Linear(1, 1), process_group=ProcessGroupDummy(0, 1),
                                                find_unused_parameters=True)
    sys.stderr.flush()
    with tempfile.TemporaryFile() as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            probe(torch.zeros(1, 1))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = b"".join(ln for ln in caught.read().splitlines(keepends=True) if DDP_UNUSED_NOTICE not in ln)
            if rest:
                os.write(2, rest)


# ---------------------------------------------------------------------------------------------------------------
# Training.

def setup(args: argparse.Namespace) -> tuple[CharTransformer, Corpus]:
    text = Path(args.text).read_text(encoding="utf-8") if args.text else make_text()
    corpus = Corpus(text, args.block, args.seed)
    torch.manual_seed(args.seed)  # every worker of every group builds the same initial weights
    model = CharTransformer(len(corpus.chars), args.block, d=args.d_model, layers=args.layers)
    return model, corpus


def per_worker_batch(args: argparse.Namespace, total_workers: int) -> int:
    if args.global_batch % total_workers:
        sys.exit(f"--global-batch {args.global_batch} is not a multiple of the {total_workers} workers")
    return args.global_batch // total_workers


def make_manager(args: argparse.Namespace, group: int, model: nn.Module, opt: torch.optim.Optimizer):
    """TorchFT's Manager of this group: the lighthouse's quorum each step, and what a recovering peer copies."""
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    def state_dict() -> dict[str, object]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd: dict[str, dict[str, object]]) -> None:
        # The peer's tensors lie in read-only bytes: the model's load copies them, the optimizer's would keep them
        # (AdamW's moments would then be written in place, in memory that Python deems immutable), hence the copy.
        model.load_state_dict(sd["model"])
        opt.load_state_dict(copy.deepcopy(sd["optim"]))
        HEALS.loaded += 1

    # The store is the group's own (MASTER_ADDR:MASTER_PORT, hosted by rank 0's init_process_group); the
    # lighthouse and rank 0's port come from TORCHFT_LIGHTHOUSE and TORCHFT_MANAGER_PORT.
    return Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)),
        min_replica_size=args.min_replicas,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"ft_train_{group}",  # trailing digits: the group's id (TorchFT derives global ranks from it)
        timeout=timedelta(seconds=args.timeout),
        quorum_timeout=timedelta(seconds=args.quorum_timeout),
        connect_timeout=timedelta(seconds=args.timeout),
    )


def group_ddp(manager, model: nn.Module, world: int) -> nn.Module:
    """TorchFT's DDP: gradients averaged inside the group (when it has more than one worker), then across the
    groups of the quorum by the Manager.

    Its own communication hook: torchft 0.2.0's asserts when the cross-group allreduce fails (a peer group died:
    `assert fut._fut` in torchft/ddp.py). Here a failed allreduce is left to the Manager, which recorded it, so
    that should_commit() answers False and the step is dropped by every group of the quorum."""
    from torchft.ddp import DistributedDataParallel

    class GroupDDP(DistributedDataParallel):
        @staticmethod
        def _comm_hook(state, bucket):  # no annotations: DDP checks them, and they would be strings here
            buf = bucket.buffer()
            if world > 1:
                dist.all_reduce(buf)
                buf.div_(world)
            state.allreduce(buf).wait()  # in place: the sum over the quorum's groups / their number
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(buf)
            return fut

    return GroupDDP(manager, model)


def train_ft(args: argparse.Namespace) -> None:
    quiet_known_noise()
    if not os.environ.get("TORCHFT_LIGHTHOUSE"):
        sys.exit("ft mode needs TORCHFT_LIGHTHOUSE (run it with runner's replica_groups, or start "
                 "`torchft_lighthouse --min_replicas 1` and point TORCHFT_LIGHTHOUSE at it), or use --mode ddp")
    group = int(os.environ.get("REPLICA_GROUP_ID", "0"))
    groups = int(os.environ.get("NUM_REPLICA_GROUPS", "1"))
    pin_cpus(args.cpus, group)
    spend_ddp_unused_notice()
    # The group's own world: rank 0 hosts the group's store (which the Manager uses too), and a group of more
    # than one worker averages its gradients inside the group before TorchFT averages them across groups.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    worker = group * world + rank  # this worker's shard of the data among all groups' workers
    batch = per_worker_batch(args, groups * world)
    model, corpus = setup(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    manager = make_manager(args, group, model, opt)
    ddp = group_ddp(manager, model, world)
    lines = StepLines(args.log_every)
    say("start", mode="ft", group=group, groups=groups, rank=rank, world=world, pid=os.getpid(),
        attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        params=sum(p.numel() for p in model.parameters()), time=f"{time.time():.3f}")
    while manager.current_step() < args.steps:
        # Asynchronous (the Manager's default use_async_quorum=True): the lighthouse is asked while the forward pass
        # runs, so the quorum's round trip costs nothing while the forward pass is longer; a group that heals sits
        # this step out (docs/replica_groups.md, "When fault tolerance pays").
        manager.start_quorum()
        opt.zero_grad()
        x, y = corpus.batch(manager.current_step(), worker, batch)
        loss = functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
        loss.backward()
        # False when a peer failed during the step (its gradients are lost): the step is dropped, not applied.
        # A group that just copied a peer's state (it rejoined) applies it here, before its optimizer steps.
        committed = manager.should_commit()
        if committed:
            opt.step()
        step, lval = manager.current_step(), loss.item()
        if rank == 0:
            participants = manager.num_participants()
            HEALS.say_new(group, step)
            lines.say(mode="ft", group=group, step=step, commit=int(committed), groups=participants,
                      last=step >= args.steps, samples=participants * batch * world if committed else 0,
                      loss=f"{lval:.4f}", time=f"{time.time():.3f}")
            if committed:
                report_step(step, lval)
        maybe_sha(args, model, group, rank, step, committed=committed)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        say("final", group=group, step=manager.current_step(), params_sha=params_sha(model))
    manager.shutdown(wait=False)
    dist.destroy_process_group()


def maybe_sha(args: argparse.Namespace, model: nn.Module, group: int, rank: int, step: int, *, committed: bool) -> None:
    global SHA_REQUESTED  # noqa: PLW0603
    if rank == 0 and (SHA_REQUESTED or (committed and args.sha_every and step % args.sha_every == 0)):
        SHA_REQUESTED = False
        say("params", group=group, step=step, params_sha=params_sha(model))


def init_group_per_attempt(timeout: float) -> None:
    """init_process_group("gloo"), in a store namespace of its own per attempt under torchrun.

    torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True) and keeps it across restarts, with the
    dead attempt's gloo addresses in it: a restarted attempt's ranks can read them and fail in init with
    "Gloo connectFullMesh failed ... Connection refused" (docs/benchmarks.md, "Crash after init"). Prefixing
    the keys with the restart count gives each attempt clean keys. runner's workers host a fresh store on a
    fresh MASTER_PORT every attempt, so there the plain call is used."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=timeout))
    prefix = f"ft_train/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=timeout))


def train_ddp(args: argparse.Namespace) -> None:
    from torch.nn.parallel import DistributedDataParallel

    pin_cpus(args.cpus, 0)
    init_group_per_attempt(args.timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    batch = per_worker_batch(args, world)
    model, corpus = setup(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    step = 0
    ckpt = Path(args.ckpt_dir) / "ft_train.pt" if args.ckpt_dir else None
    if ckpt is not None:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
    if ckpt is not None and ckpt.exists():
        sd = torch.load(ckpt, weights_only=True)
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        step = int(sd["step"])
    ddp = DistributedDataParallel(model)
    lines = StepLines(args.log_every)
    say("start", mode="ddp", group=0, groups=1, rank=rank, world=world, pid=os.getpid(),
        attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), resumed=step,
        params=sum(p.numel() for p in model.parameters()), time=f"{time.time():.3f}")
    while step < args.steps:
        opt.zero_grad()
        x, y = corpus.batch(step, rank, batch)
        loss = functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        step += 1
        lval = loss.item()
        if rank == 0:
            lines.say(mode="ddp", group=0, step=step, commit=1, groups=1, last=step >= args.steps,
                      samples=batch * world, loss=f"{lval:.4f}", time=f"{time.time():.3f}")
            report_step(step, lval)
            if ckpt is not None and step % args.ckpt_every == 0:
                began = time.monotonic()
                tmp = ckpt.with_name(f".{ckpt.name}.{os.getpid()}.tmp")
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
                os.replace(tmp, ckpt)  # a kill mid-write leaves the previous checkpoint
                say("ckpt", group=0, step=step, seconds=f"{time.monotonic() - began:.4f}",
                    bytes=ckpt.stat().st_size, time=f"{time.time():.3f}")
        maybe_sha(args, model, 0, rank, step, committed=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        say("final", group=0, step=step, params_sha=params_sha(model))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("ft", "ddp"), default="ft",
                   help="ft: TorchFT replica groups, no checkpoint files; ddp: plain DDP, checkpoint + resume")
    p.add_argument("--steps", type=int, default=1500, help="committed steps to train (then exit 0)")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step over every worker")
    p.add_argument("--block", type=int, default=64, help="characters per sequence")
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default=None, help="train on this UTF-8 file instead of the generated corpus")
    p.add_argument("--min-replicas", type=int, default=1, help="ft: groups a step needs to commit")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds: collectives, the group's store, the Manager's RPCs and a peer's weights")
    p.add_argument("--quorum-timeout", type=float, default=60.0, help="ft: seconds to wait for a quorum")
    p.add_argument("--ckpt-dir", default=None, help="ddp: checkpoint folder (resumed from when present)")
    p.add_argument("--ckpt-every", type=int, default=100, help="ddp: steps between checkpoints")
    p.add_argument("--sha-every", type=int, default=0, help="also print the params checksum every N committed steps")
    p.add_argument("--cpus", default="", help="pin group k to the k-th of these '|'-separated CPU lists (0,1|2,3)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step (pacing)")
    p.add_argument("--log-every", type=log_every, default=1, metavar="N",
                   help="print one step line in N (and always the first, the last, a dropped step and a change in "
                        "the groups that stepped)")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    signal.signal(signal.SIGUSR1, on_sigusr1)
    if args.mode == "ft":
        train_ft(args)
    else:
        train_ddp(args)


if __name__ == "__main__":
    main()
