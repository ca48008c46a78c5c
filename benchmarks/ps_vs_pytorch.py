"""paramshard beside one plain PyTorch process on PaddlePaddle's PS CTR benchmark model (issue 11).

The model (``build_model``, one factory for every candidate): 26 categorical
fields x 1 id each, all looked up in ONE shared table of 1,000,000 rows x dim
16 (Adagrad lr 0.05, rows initialised uniform in [-0.01, 0.01); paramshard's
``capacity=1M`` reserves the rows' room up front, as PyTorch's table has), the 26 x 16
embedding outputs concatenated with 13 dense features into an MLP 400-400-1
(ReLU), BCE-with-logits, Adam lr 1e-3 on the dense part, batch 2048,
``torch.set_num_threads(1)`` in every process, the same seeded dense weights
everywhere. Ids are in [0, 1M) for both engines, drawn ``uniform`` or ``zipf``
(rank r with P ~ (r+1)^-1.1, ranks permuted over the table so hot ids are
spread); labels come from a hidden logistic model (per-id and dense weights),
so test AUC means something. The driver writes the data once as .npy files
(untimed); trainer t of T takes every T-th batch.

Candidates, each a fresh process or job started by this driver (log file,
deadline, torn down by PID in every case):

1. ``PyTorch 1 process``: the worker with ``--engine torch``: ``nn.EmbeddingBag(
   sparse=True)`` + ``torch.optim.Adagrad``, ``torch.optim.Adam`` on the MLP.
2. ``paramshard standalone``: the worker with ``--engine ps`` under plain
   python, no PARAMSHARD_* variables: ``ps.Trainer`` starts an in-process server
   (the default mode, sync, so no push is left in flight).
3. ``1s+1w async``, 4. ``2s+2w async``, 5. ``2s+2w sync``: the same worker under
   ``paramshard launch --servers S --trainers T --mode M``.
6.-7. ``1s+1w async (stale rows)``, ``2s+2w async (stale rows)``: as 3 and 4
   with ``trainer.prefetching(batches, fresh_rows=False)``: every row of the
   next batch fetched ahead, even those the current step is about to update.
8.-9. ``1s+1w async (no overlap)``, ``2s+2w async (no overlap)``: as 3 and 4
   with ``--no-overlap``: no ``trainer.prefetching(...)`` and
   ``ps.Trainer(..., max_in_flight=0)`` (what the overlap buys, and costs).
10. ``2s+2w async (plain TCP)``: as 4 under ``launch --insecure``: what CurveZMQ, on by default, costs.
11.-12. ``PaddlePaddle PS 1s+1w async``, ``PaddlePaddle PS 2s+2w async``: PaddlePaddle 3.0.0's own
   parameter server (fleet, static graph, ``a_sync``) on the same model, data and timing, every server
   and trainer a process of ``.venv-paddle`` (``paddle_peer.py``, ``paddle_ps_ctr.py``: what differs
   from the PyTorch model is said there). ``--paddle off`` leaves them out; without ``.venv-paddle``
   (scripts/install-paddle-peer.sh) they are skipped with the reason printed.

The paramshard loop is the plain user loop plus one wrapper line
(``for dense, ids, labels in trainer.prefetching(batches): ...``). Every
candidate trains one epoch of the same batches (the batch count is a multiple
of 4, so 1, 2 or 4 trainers share it evenly): final test AUC / logloss,
computed by the chief after every trainer finished, compare at equal epochs.
Throughput: each trainer times its steady state (samples after its first
``--warmup`` steps over the time from the end of that step to the end of its
loop); a job's samples/s is the sum over its trainers. ``--repeats`` rounds
run every (id distribution, candidate) once, in an order rotated and reversed
from round to round; the tables give medians, min-max and ratios to PyTorch's
median in the same distribution. The CPU table (``cpu_budget.py``) gives each job's CPU
a step, every process of it (trainers, servers, launcher; I/O threads included) over the
window in which all its trainers were timing, the cores that window kept busy, and the
samples/s that cost allows when every core is busy (cores x batch / CPU a step), beside
the MLP's forward and backward alone (timed in PyTorch's worker): the floor of any step. Every process gets the launcher's
GLIBC_TUNABLES (``paramshard.launch.api.MALLOC_TUNABLES``), PyTorch's too.

Scaling (``--no-scaling`` skips it):
(a) pull+push of 2048 x 26 uniform ids (de-duplicated, in first-seen order as
    SparseEmbedding sends them) on tables of ``--table-sizes`` rows (dim 16,
    Adagrad) in one ``python -m paramshard server`` process, filled first with
    ``SparseClient.import_sparse`` in chunks, sizes interleaved; rows/s and the
    ratio to the smallest table (does the cost stay flat as the table grows?).
(b) samples/s for 1, 2 and 4 trainers (2 servers, async, uniform ids), run in
    the same rounds as the candidates, with the ratio to 1 trainer.

    .venv/bin/python benchmarks/ps_vs_pytorch.py [--train-rows 200000] [--repeats 3] [--no-scaling] [--markdown]
    .venv/bin/python benchmarks/ps_vs_pytorch.py --quick          # smoke test: tiny data, 1 round, 1M table
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402
import cpu_budget  # noqa: E402
import paddle_peer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
THIS = Path(__file__).resolve()

ROWS, DIM, FIELDS, DENSE = 1_000_000, 16, 26, 13
TABLE_LR, DENSE_LR, INIT = 0.05, 1e-3, 0.01
ZIPF_S = 1.1
DISTS = ("uniform", "zipf")
EVAL_BATCH = 8192
SHARE = 4            # the batch count is a multiple of this: 1, 2 or 4 trainers split it evenly


# ===================================================================== model (every candidate)
def build_model(engine: str, seed: int):
    """The CTR model with a paramshard or a PyTorch table; the same dense weights for a seed."""
    import torch
    import torch.nn as nn

    class CTR(nn.Module):
        def __init__(self, make_table):
            super().__init__()
            # The MLP first, right after the seed: the same dense weights whatever the table is
            # (nn.EmbeddingBag draws its own initial values from the global generator).
            self.mlp = nn.Sequential(nn.Linear(DENSE + FIELDS * DIM, 400), nn.ReLU(), nn.Linear(400, 400),
                                     nn.ReLU(), nn.Linear(400, 1))
            self.emb = make_table()

        def forward(self, dense, ids):
            # An EmbeddingBag of one id per bag gives one row per field: [B*26, 1] -> [B, 26*16].
            rows = self.emb(ids.reshape(-1, 1)).view(ids.shape[0], FIELDS * DIM)
            return self.mlp(torch.cat([dense, rows], 1)).squeeze(1)

    def torch_table():
        table = nn.EmbeddingBag(ROWS, DIM, mode="sum", sparse=True)
        with torch.no_grad():
            table.weight.uniform_(-INIT, INIT, generator=torch.Generator().manual_seed(seed + 1))
        return table

    def ps_table():
        import paramshard as ps
        # capacity: the servers make room for the table's 1M rows up front, as nn.EmbeddingBag(1M)
        # does; rows are still created (initialised) as their ids first come.
        return ps.SparseEmbedding("emb", DIM, optimizer=ps.optim.Adagrad(lr=TABLE_LR), init_scale=INIT,
                                  capacity=ROWS)

    torch.manual_seed(seed)
    return CTR(ps_table if engine == "ps" else torch_table)


# ===================================================================== data (driver writes, workers read)
def hidden_weights(seed: int):
    rng = np.random.default_rng([seed, 99])
    return rng.normal(0, 0.4, ROWS).astype(np.float32), rng.normal(0, 1 / math.sqrt(DENSE), DENSE), -1.2


def draw_ids(rng, dist: str, n: int, seed: int) -> np.ndarray:
    if dist == "uniform":
        return rng.integers(0, ROWS, (n, FIELDS), dtype=np.int64)
    cdf = np.cumsum((np.arange(ROWS, dtype=np.float64) + 1) ** -ZIPF_S)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random((n, FIELDS)), side="right"), ROWS - 1)
    return np.random.default_rng([seed, 7]).permutation(ROWS)[ranks]      # hot ids spread over the table


def generate(out: Path, dist: str, train_rows: int, test_rows: int, batch: int, seed: int) -> dict:
    """train/test .npy files of one id distribution; returns what the notes say about it."""
    from paramshard.data import auc
    rng = np.random.default_rng([seed, DISTS.index(dist)])
    w_id, w_dense, bias = hidden_weights(seed)
    n = train_rows + test_rows
    dense = rng.standard_normal((n, DENSE), dtype=np.float32)
    ids = draw_ids(rng, dist, n, seed)
    logit = w_id[ids].sum(1, dtype=np.float64) + dense @ w_dense + bias
    prob = 1 / (1 + np.exp(-logit))
    labels = (rng.random(n) < prob).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    for split, sl in (("train", slice(0, train_rows)), ("test", slice(train_rows, n))):
        np.save(out / f"{split}_dense.npy", dense[sl])
        np.save(out / f"{split}_ids.npy", ids[sl])
        np.save(out / f"{split}_labels.npy", labels[sl])
    distinct = [len(np.unique(ids[s:s + batch])) for s in range(0, min(train_rows, 8 * batch), batch)]
    return {"hidden_auc": auc(labels[train_rows:], prob[train_rows:]), "positive": float(labels.mean()),
            "distinct_per_batch": float(np.mean(distinct))}


def load_split(data: Path, split: str):
    return tuple(np.load(data / f"{split}_{k}.npy") for k in ("dense", "ids", "labels"))


def my_batches(data: Path, batch: int, batches: int, trainer: int, trainers: int) -> list:
    """Trainer ``trainer`` of ``trainers`` takes every trainers-th of the first ``batches`` batches."""
    import torch
    dense, ids, labels = load_split(data, "train")
    return [tuple(torch.from_numpy(np.ascontiguousarray(a[k * batch:(k + 1) * batch])) for a in (dense, ids, labels))
            for k in range(trainer, batches, trainers)]


# ===================================================================== worker (one trainer process)
class SteadyClock:
    """Samples and seconds after the first ``warmup`` steps (to the end of the loop); the window's
    wall-clock ends too, for the driver's CPU budget (cpu_budget.py)."""

    def __init__(self, warmup: int):
        self.warmup, self.steps, self.samples = warmup, 0, 0
        self.t0 = time.perf_counter() if warmup == 0 else None
        self.wall0 = time.time() if warmup == 0 else None

    def tick(self, n: int) -> None:
        self.steps += 1
        if self.steps == self.warmup:
            self.t0, self.wall0 = time.perf_counter(), time.time()
        elif self.steps > self.warmup:
            self.samples += n

    def result(self) -> dict:
        seconds = time.perf_counter() - self.t0
        return {"steps": self.steps, "samples_timed": self.samples, "seconds_timed": seconds,
                "samples_per_s": self.samples / seconds, "steps_timed": self.steps - self.warmup,
                "window": [self.wall0, time.time()]}


def predict(model, test) -> np.ndarray:
    import torch
    dense, ids, _ = test
    model.eval()
    with torch.no_grad():
        out = [torch.sigmoid(model(torch.from_numpy(dense[s:s + EVAL_BATCH]),
                                   torch.from_numpy(ids[s:s + EVAL_BATCH]))).numpy()
               for s in range(0, len(dense), EVAL_BATCH)]
    return np.concatenate(out)


def train_torch(args, batches) -> dict:
    import torch
    import torch.nn.functional as F
    model = build_model("torch", args.seed)
    opt_table = torch.optim.Adagrad(model.emb.parameters(), lr=TABLE_LR)
    opt_dense = torch.optim.Adam(model.mlp.parameters(), lr=DENSE_LR)
    clock = SteadyClock(args.warmup)
    for dense, ids, labels in batches:
        opt_table.zero_grad(set_to_none=True)
        opt_dense.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(model(dense, ids), labels).backward()
        opt_table.step()
        opt_dense.step()
        clock.tick(len(labels))
    result = clock.result()
    result["probs"] = predict(model, load_split(Path(args.data), "test"))
    result["mlp_ms"] = mlp_alone_ms(model, batches[-1])
    return result


def mlp_alone_ms(model, batch, steps: int = 20) -> float:
    """ms of the MLP's forward and backward alone on one batch (rows as a leaf tensor): the part of a
    step that every candidate computes, whatever keeps its table; the floor of the CPU budget."""
    import torch
    import torch.nn.functional as F
    dense, ids, labels = batch
    with torch.no_grad():
        rows = model.emb(ids.reshape(-1, 1)).view(ids.shape[0], FIELDS * DIM)
    rows.requires_grad_(True)
    times = []
    for _ in range(steps + 3):
        t0 = time.perf_counter()
        model.mlp.zero_grad(set_to_none=True)
        F.binary_cross_entropy_with_logits(model.mlp(torch.cat([dense, rows], 1)).squeeze(1), labels).backward()
        times.append(time.perf_counter() - t0)
    return C.median(times[3:]) * 1e3


def wait_for_other_trainers(trainer, timeout: float) -> None:
    """The chief evaluates the final model: every other trainer must have left first."""
    others = set(range(1, trainer.env.num_trainers))
    deadline = time.monotonic() + timeout
    while others:
        stats = trainer.server_stats()
        done = set.intersection(*(set(s["trainers"]["left"]) | set(s["trainers"]["lost"]) for s in stats))
        if others <= done:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"trainers {sorted(others - done)} did not finish within {timeout:g} s")
        time.sleep(0.1)


def train_ps(args, data: Path) -> dict:
    import torch.nn.functional as F

    import paramshard as ps
    model = build_model("ps", args.seed)
    with ps.Trainer(model, optimizer=ps.optim.Adam(lr=DENSE_LR),
                    max_in_flight=0 if args.no_overlap else None) as trainer:
        batches = my_batches(data, args.batch, args.batches, trainer.trainer_id, trainer.env.num_trainers)
        check_steps(len(batches), args.warmup)
        clock = SteadyClock(args.warmup)
        if args.no_overlap:
            for dense, ids, labels in batches:
                loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
                trainer.step(loss)
                clock.tick(len(labels))
        else:
            for dense, ids, labels in trainer.prefetching(batches, fresh_rows=not args.stale_rows):
                loss = F.binary_cross_entropy_with_logits(model(dense, ids), labels)
                trainer.step(loss)
                clock.tick(len(labels))
        # Async: the last push may still be in flight here, as after any user's loop; close() takes it.
        result = clock.result()
        result["trainer_id"], result["num_trainers"] = trainer.trainer_id, trainer.env.num_trainers
        result["pipeline"] = trainer.pipeline_stats()
        if trainer.is_chief:
            wait_for_other_trainers(trainer, timeout=300)
            result["server_stats"] = trainer.server_stats()      # before the evaluation's pulls
            trainer.pull()
            result["probs"] = predict(model, load_split(data, "test"))
    return result


def check_steps(steps: int, warmup: int) -> None:
    if steps <= warmup:
        raise SystemExit(f"{steps} steps for this trainer, not more than --warmup {warmup}: nothing to time")


def worker_main(argv) -> int:
    p = argparse.ArgumentParser(prog="ps_vs_pytorch.py worker", description="one trainer of one candidate")
    p.add_argument("--engine", choices=("torch", "ps"), required=True)
    p.add_argument("--data", required=True, help="directory of the driver's .npy files")
    p.add_argument("--result", required=True, help="directory for trainer-<id>.json")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--batches", type=int, required=True, help="batches of the whole epoch, over all trainers")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--stale-rows", action="store_true", help="prefetching(fresh_rows=False)")
    args = p.parse_args(argv)
    import warnings

    import torch
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")   # torch.optim.Adagrad, sparse grads
    data = Path(args.data)
    if args.engine == "torch":
        batches = my_batches(data, args.batch, args.batches, 0, 1)
        check_steps(len(batches), args.warmup)
        result = train_torch(args, batches)
        result["trainer_id"], result["num_trainers"] = 0, 1
    else:
        result = train_ps(args, data)
    probs = result.pop("probs", None)
    if probs is not None:
        from paramshard.data import auc, logloss
        labels = np.load(data / "test_labels.npy")
        result["auc"], result["logloss"] = auc(labels, probs), logloss(labels, probs)
    path = Path(args.result) / f"trainer-{result['trainer_id']}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, path)       # the driver never sees half a file
    return 0


# ===================================================================== driver: candidates and jobs
@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str
    engine: str                      # torch | ps
    servers: int = 0                 # 0: no launcher (a plain python process)
    trainers: int = 1
    mode: str = "async"
    overlap: bool = True
    stale_rows: bool = False         # prefetching(fresh_rows=False)
    insecure: bool = False           # launch --insecure: plain TCP, what CurveZMQ costs


PT = Candidate("PyTorch 1 process", "torch")
CANDIDATES = (
    PT,
    Candidate("paramshard standalone", "ps"),
    Candidate("1s+1w async", "ps", 1, 1, "async"),
    Candidate("2s+2w async", "ps", 2, 2, "async"),
    Candidate("2s+2w sync", "ps", 2, 2, "sync"),
    Candidate("1s+1w async (stale rows)", "ps", 1, 1, "async", stale_rows=True),
    Candidate("2s+2w async (stale rows)", "ps", 2, 2, "async", stale_rows=True),
    Candidate("1s+1w async (no overlap)", "ps", 1, 1, "async", overlap=False),
    Candidate("2s+2w async (no overlap)", "ps", 2, 2, "async", overlap=False),
    Candidate("2s+2w async (plain TCP)", "ps", 2, 2, "async", insecure=True),
    Candidate("PaddlePaddle PS 1s+1w async", "paddle", 1, 1, "async"),
    Candidate("PaddlePaddle PS 2s+2w async", "paddle", 2, 2, "async"),
)
VS_PADDLE = (("1s+1w async", "PaddlePaddle PS 1s+1w async"), ("2s+2w async", "PaddlePaddle PS 2s+2w async"))
SCALING = {1: Candidate("2s+1w async", "ps", 2, 1, "async"), 2: CANDIDATES[3],
           4: Candidate("2s+4w async", "ps", 2, 4, "async")}      # (b): trainers -> job, uniform ids
PHASES_OF = "1s+1w async"


def child_environ() -> dict:
    """No PARAMSHARD_* (standalone must find no cluster) but the row store's (benchmarks/stores_ctr.sh);
    the launcher's malloc settings for everyone."""
    from paramshard.launch.api import MALLOC_TUNABLES
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARAMSHARD_", "PADDLE_", "OMPI_COMM_WORLD"))
           or k == "PARAMSHARD_ROW_STORE"}
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("GLIBC_TUNABLES", MALLOC_TUNABLES)
    return env


def paramshard_cli() -> list[str]:
    exe = Path(sys.executable).parent / "paramshard"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "paramshard"]


def job_argv(cand: Candidate, data: Path, result: Path, args) -> list[str]:
    worker = [str(THIS), "worker", "--engine", cand.engine, "--data", str(data), "--result", str(result),
              "--batch", str(args.batch), "--batches", str(args.batches), "--warmup", str(args.warmup),
              "--seed", str(args.seed)] + ([] if cand.overlap else ["--no-overlap"]) + (
        ["--stale-rows"] if cand.stale_rows else [])
    if not cand.servers:
        return [sys.executable, *worker]
    return [*paramshard_cli(), "launch", "--servers", str(cand.servers), "--trainers", str(cand.trainers),
            "--mode", cand.mode, "--timeout", "120", *(["--insecure"] if cand.insecure else []), *worker]


def run_job(children: C.Children, cand: Candidate, data: Path, workdir: Path, args) -> dict:
    """One fresh process (or launcher job) to its end or its deadline; torn down in every case."""
    tree: dict[str, cpu_budget.ProcessTreeCPU] = {}

    def watch(roots) -> None:
        if "cpu" not in tree:               # the job's roots are the same every poll
            tree["cpu"] = cpu_budget.ProcessTreeCPU(roots)
        tree["cpu"].sample()
    if cand.engine == "paddle":
        trainers = paddle_peer.run(children, f"{cand.name} ({data.name})", cand.servers, cand.trainers, data,
                                   args.paddle_init, child_environ(), args, on_poll=watch)
        job = combine(trainers)
        job["cpu"] = cpu_budget.budget(tree["cpu"], trainers) if "cpu" in tree else None
        return job
    result = Path(tempfile.mkdtemp(prefix="result-", dir=workdir))
    try:
        trainers = C.run_for_results(children, f"{cand.name} ({data.name})", job_argv(cand, data, result, args),
                                     child_environ(), result, cand.trainers, args.run_timeout,
                                     results_suffice=True, on_poll=watch)
        job = combine(trainers)
        job["cpu"] = cpu_budget.budget(tree["cpu"], trainers) if "cpu" in tree else None
        return job
    finally:
        shutil.rmtree(result, ignore_errors=True)


def combine(trainers: list[dict]) -> dict:
    """A job's numbers: samples/s summed over trainers, metrics from the chief, pipeline stats summed."""
    chief = next(t for t in trainers if t["trainer_id"] == 0)
    out = {"samples_per_s": sum(t["samples_per_s"] for t in trainers), "auc": chief["auc"],
           "logloss": chief["logloss"], "steps": sum(t["steps"] for t in trainers),
           "steps_per_trainer": chief["steps"], "mlp_ms": chief.get("mlp_ms")}
    pipes = [t["pipeline"] for t in trainers if t.get("pipeline")]
    if pipes:
        keys = ("steps", "prefetch_hits", "prefetch_misses", "pull_wait_s", "push_wait_s")
        out["pipeline"] = {k: sum(p.get(k, 0) for p in pipes) for k in keys}
        out["pipeline"]["max_in_flight_seen"] = max(p.get("max_in_flight_seen", 0) for p in pipes)
    stats = chief.get("server_stats") or []
    if stats and all("phase_seconds" in s for s in stats):
        out["phases"] = phase_ms(stats, out["steps"])
    return out


# What a server's time per step goes to (ParameterServer's ``phase_seconds`` and, inside the
# sparse ops, the table's own): the ops of a training step, not registration or stats.
SERVER_PHASES = ("decode", "pull_sparse", "push_sparse", "push_dense", "reply")
TABLE_PHASES = ("pull_lookup", "pull_gather", "push_lookup", "push_optimizer")


def phase_ms(stats: list[dict], steps: int) -> dict:
    """ms per step (one trainer's push) of each server phase, summed over the servers."""
    out = {}
    for s in stats:
        for phase in SERVER_PHASES:
            out[phase] = out.get(phase, 0.0) + s["phase_seconds"].get(phase, 0.0)
        for table in s.get("tables", {}).values():
            for phase in TABLE_PHASES:
                key = f"  of which {phase}"
                out[key] = out.get(key, 0.0) + table.get("phase_seconds", {}).get(phase, 0.0)
    return {k: v / max(steps, 1) * 1e3 for k, v in out.items()}


def round_order(jobs: list, rnd: int, repeats: int) -> list:
    """Rotated by a different offset each round and reversed every other round: no job keeps
    its place or its neighbour, so slow drift on the machine hits every candidate alike."""
    shift = (rnd * -(-len(jobs) // max(repeats, 1))) % len(jobs)
    order = jobs[shift:] + jobs[:shift]
    return order[::-1] if rnd % 2 else order


# ===================================================================== scaling (a): table size
GiB = 1 << 30


def table_bytes(rows: int) -> tuple[int, int]:
    """(final, peak) bytes of an Adagrad table of dim 16 whose capacity is capped at ``rows``
    (PARAMSHARD_MAX_ROWS): values + accumulator, an id index of 12 B per bucket (power of two,
    at most 3/4 full); at the last growth the old arrays (rows / 1.25) and the index's
    previous size coexist with the new ones."""
    per_row = DIM * 4 * 2
    index = 12 * (1 << math.ceil(math.log2(rows / 0.75)))
    return per_row * rows + index, int(per_row * rows * (1 + 1 / 1.25) + index * 1.5)


def start_big_server(children: C.Children, max_rows: int) -> tuple[str, object]:
    """One async server, configured by the environment contract; capacity capped at the largest table."""
    from paramshard.launch.engines.ports import free_ports
    (port,) = free_ports(1, C.HOST)
    address = f"{C.HOST}:{port}"
    env = dict(child_environ(), PARAMSHARD_ROLE="server", PARAMSHARD_SERVERS=address, PARAMSHARD_SERVER_ID="0",
               PARAMSHARD_TRAINERS="1", PARAMSHARD_MODE="async", PARAMSHARD_TIMEOUT="300",
               PARAMSHARD_MAX_ROWS=str(max_rows))
    proc = children.spawn("paramshard server (table sizes)", [sys.executable, "-m", "paramshard", "server"], env)
    return address, proc


def fill_table(client, name: str, rows: int, chunk: int, min_free: int, log) -> dict:
    """Ids 0..rows-1, imported ``chunk`` at a time (one random block of values, reused)."""
    values = np.random.default_rng(3).uniform(-INIT, INIT, (min(chunk, rows), DIM)).astype(np.float32)
    t0 = time.perf_counter()
    done, stopped = 0, None
    while done < rows:
        if C.mem_available() < min_free:
            stopped = f"MemAvailable fell below {min_free / GiB:.1f} GiB"
            log(f"  {name}: stopping the fill at {done:,} rows: {stopped}")
            break
        n = min(chunk, rows - done)
        client.import_sparse(name, np.arange(done, done + n, dtype=np.uint64), values[:n])
        done += n
    seconds = time.perf_counter() - t0
    log(f"  {name}: {done:,} rows imported in {seconds:.1f} s")
    return {"rows": done, "seconds": seconds, "stopped": stopped}


def table_scaling(args, children: C.Children, log) -> dict:
    """pull+push of one batch's distinct ids on tables of each size, one server, sizes interleaved."""
    import pandas as pd

    from paramshard.client.sparse import SparseClient, TableSpec
    from paramshard.optim import Adagrad
    from paramshard.transport.links import ServerLinks
    sizes = sorted(args.table_sizes)
    avail = C.mem_available()
    need = sum(table_bytes(s)[0] for s in sizes[:-1]) + table_bytes(sizes[-1])[1] + int(args.min_free_gib * GiB)
    while len(sizes) > 1 and need > avail:                      # drop the largest tables that cannot fit
        log(f"  skipping the {sizes[-1]:,}-row table: about {need / GiB:.1f} GiB needed, "
            f"{avail / GiB:.1f} GiB available")
        sizes.pop()
        need = sum(table_bytes(s)[0] for s in sizes[:-1]) + table_bytes(sizes[-1])[1] + int(args.min_free_gib * GiB)
    links = None
    try:
        address, proc = start_big_server(children, sizes[-1])
        links = ServerLinks([address], timeout=300.0, who="bench")
        C.wait_servers(children, links)
        client = SparseClient(links, 0)
        filled = {}
        for size in sizes:
            name = f"rows_{size}"
            client.register_sparse(TableSpec(name, DIM, Adagrad(lr=TABLE_LR)))
            filled[size] = fill_table(client, name, size, args.fill_chunk, int(args.min_free_gib * GiB), log)
            children.check_alive()
        rss = C.proc_status(proc.pid)
        before = links.request(0, {"op": "stats"})[0]["stats"]["tables"]
        times = time_tables(client, filled, args.batch * FIELDS, args.table_reps, pd)
        after = links.request(0, {"op": "stats"})[0]["stats"]["tables"]
        if any(after[n]["rows"] != before[n]["rows"] for n in before):
            raise AssertionError("the timed pulls created rows: the ids were not the imported ones")
    finally:
        if links is not None:
            links.close()
        children.stop_all()
    return {"filled": filled, "times": times, "rss": rss, "bytes": {s: before[f"rows_{s}"]["bytes"] for s in sizes}}


def time_tables(client, filled: dict, lookups: int, reps: int, pd) -> dict:
    """[(distinct ids, pull s, push s)] per table size, after 2 untimed rounds."""
    rng = np.random.default_rng(11)
    sizes = list(filled)
    times = {s: [] for s in sizes}
    for rep in range(reps + 2):
        for size in (sizes if rep % 2 == 0 else sizes[::-1]):
            name, rows = f"rows_{size}", filled[size]["rows"]
            ids = pd.unique(rng.integers(0, rows, lookups)).astype(np.uint64)    # first-seen order
            grads = np.full((len(ids), DIM), 1e-3, np.float32)
            t0 = time.perf_counter()
            client.pull_sparse(name, ids, DIM)
            t1 = time.perf_counter()
            client.push_sparse(name, ids, grads, 0)
            t2 = time.perf_counter()
            if rep >= 2:
                times[size].append((len(ids), t1 - t0, t2 - t1))
    return times


# ===================================================================== report
def fmt_rows(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"


def main_table(runs: dict, dists) -> list:
    rows = []
    for dist in dists:
        pt_rate = C.median(r["samples_per_s"] for r in runs[(dist, PT.name)])
        pt_auc = C.median(r["auc"] for r in runs[(dist, PT.name)])
        for cand in CANDIDATES:
            if (dist, cand.name) not in runs:      # left out by --only
                continue
            rs = runs[(dist, cand.name)]
            rates = [r["samples_per_s"] for r in rs]
            if any(r["auc"] is None for r in rs):       # a candidate that could not evaluate says so
                metrics = ["n/a"] * 3
            else:
                auc = C.median(r["auc"] for r in rs)
                metrics = [f"{auc:.4f}", f"{auc - pt_auc:+.4f}", f"{C.median(r['logloss'] for r in rs):.4f}"]
            rows.append([dist, cand.name, f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                         f"{C.median(rates) / pt_rate:.2f}x", *metrics])
    return rows


def paddle_table(runs: dict, dists) -> list:
    """paramshard's job over PaddlePaddle's PS job of the same shape, medians in the same rounds."""
    rows = []
    for dist in dists:
        for ours, theirs in VS_PADDLE:
            if (dist, ours) in runs and (dist, theirs) in runs:
                a, b = (C.median(r["samples_per_s"] for r in runs[(dist, n)]) for n in (ours, theirs))
                rows.append([dist, f"paramshard {ours} / {theirs}", f"{a:,.0f}", f"{b:,.0f}", f"{a / b:.2f}x"])
    return rows


def pipeline_table(runs: dict, dists) -> list:
    rows = []
    for dist in dists:
        for cand in CANDIDATES:
            rs = [r["pipeline"] for r in runs.get((dist, cand.name), []) if r.get("pipeline")]
            if not rs:
                continue

            def per_step(key):
                return C.median(p[key] / max(p["steps"], 1) * 1e3 for p in rs)
            hits = C.median(p["prefetch_hits"] for p in rs)
            used = C.median(p["prefetch_hits"] + p["prefetch_misses"] for p in rs)
            rows.append([dist, cand.name, f"{per_step('pull_wait_s'):.2f}", f"{per_step('push_wait_s'):.2f}",
                         f"{hits:.0f} of {used:.0f}", f"{C.median(p['steps'] for p in rs):.0f}",
                         str(max(p["max_in_flight_seen"] for p in rs))])
    return rows


def cpu_table(runs: dict, dists, batch: int) -> tuple[list, list]:
    """CPU ms a step per role (cpu_budget.py), and the throughput that CPU cost allows on this
    machine's cores, as a ratio to PyTorch's measured samples/s; with the MLP's own ms as the floor."""
    cores = len(os.sched_getaffinity(0))
    rows, notes = [], []
    for dist in dists:
        pt = runs[(dist, PT.name)]
        pt_rate = C.median(r["samples_per_s"] for r in pt)
        mlps = [r["mlp_ms"] for r in pt if r.get("mlp_ms")]
        mlp = C.median(mlps) if mlps else None
        if mlp:
            notes.append(f"{dist}: the MLP's forward and backward alone take {mlp:.1f} ms a step (PyTorch's "
                         f"worker, median): every candidate computes them; on {cores} cores a job whose steps "
                         f"cost only that would reach {cores * batch / mlp * 1e3 / pt_rate:.2f}x PyTorch")
        for cand in CANDIDATES:
            rs = [r["cpu"] for r in runs.get((dist, cand.name), []) if r.get("cpu")]
            if not rs:
                continue
            rates = [r["samples_per_s"] for r in runs[(dist, cand.name)]]

            def ms(role):
                return C.median(c.get(role, 0.0) for c in rs)
            total = ms("total")
            rows.append([dist, cand.name, f"{ms('trainers'):.1f}", f"{ms('servers'):.1f}",
                         f"{ms('launcher') + ms('other'):.1f}", f"{total:.1f}",
                         "n/a" if mlp is None else f"{total - mlp:.1f}", f"{C.median(c['cores_busy'] for c in rs):.2f}",
                         f"{cores * batch / total * 1e3 / pt_rate:.2f}x", f"{C.median(rates) / pt_rate:.2f}x"])
    return rows, notes


def phases_table(runs: dict, dists) -> list:
    rows = []
    for dist in dists:
        rs = [r["phases"] for r in runs.get((dist, PHASES_OF), []) if r.get("phases")]
        for phase in (rs[0] if rs else {}):
            rows.append([dist, phase, f"{C.median(p.get(phase, 0.0) for p in rs):.2f}"])
    return rows


def trainers_table(runs: dict) -> list:
    base = C.median(r["samples_per_s"] for r in runs[("uniform", SCALING[1].name)])
    rows = []
    for t, cand in SCALING.items():
        rates = [r["samples_per_s"] for r in runs[("uniform", cand.name)]]
        rows.append([str(t), cand.name, f"{C.median(rates):,.0f}", f"{min(rates):,.0f}-{max(rates):,.0f}",
                     f"{C.median(rates) / t:,.0f}", f"{C.median(rates) / base:.2f}x"])
    return rows


def sizes_table(res: dict) -> list:
    rows, base = [], None
    for size, ts in res["times"].items():
        f = res["filled"][size]
        rate = C.median(n / (a + b) for n, a, b in ts)
        base = base or rate
        rows.append([fmt_rows(size) + ("" if f["rows"] == size else f" (filled {f['rows']:,}: {f['stopped']})"),
                     f"{f['seconds']:.1f}", f"{res['bytes'][size] / GiB:.2f}",
                     f"{C.median(n for n, _, _ in ts):,.0f}", f"{C.median(a for _, a, _ in ts) * 1e3:.1f}",
                     f"{C.median(b for _, _, b in ts) * 1e3:.1f}", f"{rate / 1e6:.2f}M", f"{rate / base:.2f}x"])
    return rows


def report(args, runs, data_info, sizes, note: str) -> None:
    tables = [(f"CTR model, {args.batches * args.batch:,} samples (one epoch), median of {args.repeats} "
               f"interleaved repeats", ["ids", "candidate", "samples/s", "min-max", "ratio to PyTorch", "test AUC",
                                        "AUC - PyTorch's", "test logloss"], main_table(runs, args.dists),
               [False, False, True, True, True, True, True, True])]
    vs = paddle_table(runs, args.dists)
    if vs:
        tables.append(("paramshard against PaddlePaddle 3.0.0's PS, same shape, same rounds (medians)",
                       ["ids", "jobs", "paramshard samples/s", "Paddle samples/s", "ratio"], vs,
                       [False, False, True, True, True]))
    pipe = pipeline_table(runs, args.dists)
    if pipe:
        tables.append(("paramshard pipeline (trainer side, per step, median of repeats)",
                       ["ids", "candidate", "pull wait ms/step", "push wait ms/step", "prefetch hits of fetched",
                        "steps (all trainers)", "max in flight"], pipe, [False, False, True, True, True, True, True]))
    cpu_rows, cpu_notes = cpu_table(runs, args.dists, args.batch)
    if cpu_rows:
        tables.append((f"CPU a step, every process of the job over the window all its trainers were timing "
                       f"(medians of repeats; cpu_budget.py), and the throughput that cost allows on "
                       f"{len(os.sched_getaffinity(0))} cores",
                       ["ids", "candidate", "trainers ms", "servers ms", "launcher ms", "total ms",
                        "outside the MLP ms", "cores busy", "CPU-bound ceiling", "measured"], cpu_rows,
                       [False, False, True, True, True, True, True, True, True, True]))
    phases = phases_table(runs, args.dists)
    if phases:
        tables.append((f"server phases, {PHASES_OF} (median of repeats)", ["ids", "phase", "ms per step"], phases,
                       [False, False, True]))
    if args.scaling:
        tables.append(("Scaling (b): trainers, 2 servers, async, uniform ids (median of repeats)",
                       ["trainers", "job", "samples/s", "min-max", "per trainer", "ratio to 1 trainer"],
                       trainers_table(runs), [True, False, True, True, True, True]))
        tables.append((f"Scaling (a): pull+push of {args.batch} x {FIELDS} uniform ids (distinct) on one server, "
                       f"dim {DIM}, Adagrad (median of {args.table_reps})",
                       ["table rows", "fill s", "table GiB", "distinct ids", "pull ms", "push ms",
                        "rows/s (pull+push)", "ratio to smallest"], sizes_table(sizes),
                       [False, True, True, True, True, True, True, True]))
    notes = [f"{d}: hidden-model test AUC {i['hidden_auc']:.4f} (the ceiling), {i['positive']:.1%} positive, "
             f"{i['distinct_per_batch']:,.0f} distinct ids in a batch of {args.batch} x {FIELDS}"
             for d, i in data_info.items()]
    notes.append(f"{args.train_rows:,} train rows ({args.batches} batches of {args.batch} used: a multiple of "
                 f"{SHARE}), {args.test_rows:,} test rows; throughput after {args.warmup} warm-up steps per trainer, "
                 f"summed over trainers; torch threads 1 in every process; every process under the launcher's "
                 f"GLIBC_TUNABLES")
    if sizes:
        notes.append(f"Scaling (a): server RSS at the end {sizes['rss']['VmRSS'] / GiB:.2f} GiB, peak "
                     f"{sizes['rss']['VmHWM'] / GiB:.2f} GiB; tables filled by import_sparse in chunks of "
                     f"{args.fill_chunk:,} rows, capacity capped by PARAMSHARD_MAX_ROWS at the largest size")
    notes += cpu_notes
    if getattr(args, "paddle_skipped", None):
        notes.append(args.paddle_skipped)
    notes.append(note)
    C.emit(args.markdown, tables, notes)


# ===================================================================== driver main
def parse_sizes(text: str) -> list[int]:
    units = {"k": 1_000, "m": 1_000_000}
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part:
            out.append(int(float(part[:-1]) * units[part[-1]]) if part[-1] in units else int(part))
    return out


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-rows", type=int, default=200_000)
    p.add_argument("--test-rows", type=int, default=50_000)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--warmup", type=int, default=10, help="untimed steps at the start of each trainer")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--dists", default=",".join(DISTS), help="id distributions (default uniform,zipf)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-timeout", type=float, default=600.0, help="deadline of one candidate run, s")
    p.add_argument("--scaling", action=argparse.BooleanOptionalAction, default=True,
                   help="table-size and trainer-count sections (default on)")
    p.add_argument("--table-sizes", default="1M,10M,50M")
    p.add_argument("--table-reps", type=int, default=20)
    p.add_argument("--fill-chunk", type=int, default=2_000_000, help="rows per import_sparse request")
    p.add_argument("--min-free-gib", type=float, default=2.0, help="stop filling below this MemAvailable")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny data, 1 round, a 1M-row table only")
    p.add_argument("--only", default="", metavar="NAMES",
                   help="comma-separated candidate names to run (PyTorch always runs: the ratios need it)")
    p.add_argument("--paddle", choices=("auto", "off"), default="auto",
                   help="PaddlePaddle PS candidates: auto runs them when .venv-paddle imports paddle "
                        "(scripts/install-paddle-peer.sh), else says why they are skipped")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.quick:
        args.train_rows, args.test_rows, args.warmup, args.repeats = 16 * args.batch, 8192, 2, 1
        args.table_sizes, args.table_reps = "1M", 5
    args.dists = [d.strip() for d in args.dists.split(",") if d.strip()]
    names = [c.name for c in CANDIDATES]
    args.only = [n.strip() for n in args.only.split(",") if n.strip()] or names
    if set(args.only) - set(names):
        p.error(f"--only: candidates are {names}")
    if not args.dists or set(args.dists) - set(DISTS) or (args.scaling and "uniform" not in args.dists):
        p.error(f"--dists: a list of {DISTS} (uniform is needed for the scaling section)")
    args.table_sizes = parse_sizes(args.table_sizes)
    args.batches = args.train_rows // args.batch // SHARE * SHARE
    if args.repeats < 1 or args.batches // SHARE <= args.warmup:
        p.error(f"need --repeats >= 1 and more than --warmup {args.warmup} steps for each of {SHARE} trainers: "
                f"{args.batches} batches of {args.batch}; raise --train-rows")
    return args


def paddle_jobs(jobs: list, args, workdir: Path, log) -> list:
    """The jobs without the Paddle candidates when --paddle off or Paddle is missing (said why), else
    the same jobs, with PyTorch's initial MLP written for the Paddle workers (args.paddle_init)."""
    if not any(cand.engine == "paddle" for _, cand in jobs):
        return jobs
    ok, why = (False, "--paddle off") if args.paddle == "off" else paddle_peer.available()
    if not ok:
        args.paddle_skipped = f"PaddlePaddle PS candidates skipped: {why}"
        log(args.paddle_skipped)
        return [(d, c) for d, c in jobs if c.engine != "paddle"]
    args.paddle_init = paddle_peer.write_dense_init(build_model("torch", args.seed).mlp, workdir / "paddle-init")
    log(f"PaddlePaddle {why} from {paddle_peer.python().parent.parent.name}")
    return jobs


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        return worker_main(argv[1:])
    args = parse_args(argv)
    command = shlex.join([os.path.relpath(sys.executable, ROOT), os.path.relpath(THIS, ROOT), *argv])
    print(f"```\n{command}\n```\n" if args.markdown else f"$ {command}", flush=True)
    C.install_sigterm_as_exit()
    note = C.machine_note()
    t_start = time.monotonic()

    def log(msg):
        print(msg, file=sys.stderr, flush=True)          # progress: stdout holds only the result

    children = C.Children()
    workdir = Path(tempfile.mkdtemp(prefix="bench-ps-vs-pt-"))
    runs: dict[tuple, list] = {}
    sizes = None
    try:
        data_info = {}
        for dist in args.dists:
            log(f"generating {args.train_rows + args.test_rows:,} rows of {dist} ids ...")
            data_info[dist] = generate(workdir / dist, dist, args.train_rows, args.test_rows, args.batch, args.seed)
        jobs = [(dist, cand) for cand in CANDIDATES for dist in args.dists if cand.name in args.only or cand is PT]
        jobs = paddle_jobs(jobs, args, workdir, log)
        if args.scaling:
            jobs += [("uniform", cand) for cand in SCALING.values() if ("uniform", cand) not in jobs]
        for rnd in range(args.repeats):
            for k, (dist, cand) in enumerate(round_order(jobs, rnd, args.repeats)):
                r = run_job(children, cand, workdir / dist, workdir, args)
                runs.setdefault((dist, cand.name), []).append(r)
                log(f"round {rnd + 1}/{args.repeats}, {k + 1}/{len(jobs)}: {dist:7} {cand.name:27} "
                    f"{r['samples_per_s']:9,.0f} samples/s, AUC "
                    + ("n/a" if r["auc"] is None else f"{r['auc']:.4f}"))
        if args.scaling:
            log(f"table sizes {', '.join(fmt_rows(s) for s in args.table_sizes)}: filling one server ...")
            sizes = table_scaling(args, children, log)
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    note += f"; load average {os.getloadavg()[0]:.2f} at end; {time.monotonic() - t_start:.0f} s"
    report(args, runs, data_info, sizes, note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
