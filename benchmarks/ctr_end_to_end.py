"""End-to-end CTR training: paramshard (1 server + 1 trainer) vs one plain PyTorch process.

The same WideDeep model (paramshard.models.WideDeep on the Criteo layout: wide table of dim 1, deep table
of dim 16, MLP 400-400-1) on the same synthetic Criteo-like data, the same
batches in the same order, the same number of steps:

- paramshard: tables are ``SparseEmbedding`` (rows on a ``python -m paramshard
  server`` subprocess, Adagrad there), dense parameters trained with Adam on
  the server; the trainer is this process (``ps.Trainer(model, env=...)``).
- PyTorch: tables are ``nn.EmbeddingBag(vocab, dim, mode="sum", sparse=True)``
  with hashed ids mapped to 0..vocab-1 beforehand (outside the timed loop, as
  a plain PyTorch user would), ``torch.optim.Adagrad`` on the tables (sparse
  gradients) and ``torch.optim.Adam`` on the dense part.

Both start from the same dense weights and tables initialised uniform in
[-0.01, 0.01) (paramshard's default). Data is generated and parsed into
in-memory batches before any timing. The two candidates are interleaved in
segments of ``--segment`` steps (alternating which goes first), so machine
noise hits both alike; samples/s is reported over the whole run and as the
median of the segments. Test AUC and log loss after the same steps show that
both learn alike.

    .venv/bin/python benchmarks/ctr_end_to_end.py [--train-rows 200000] [--batch-sizes 1024,4096] [--markdown]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

PS, PT = "paramshard 1 srv + 1 trainer", "PyTorch 1 process"
TABLE_LR, DENSE_LR, INIT = 0.05, 1e-3, 0.01


def load_data(train_rows: int, test_rows: int, workdir: Path):
    """Synthetic Criteo TSV -> (train CriteoBatch, test CriteoBatch, hidden-model AUC)."""
    from paramshard.data import CriteoReader, generate_criteo
    path = workdir / "data.tsv"
    report = generate_criteo(path, train_rows + test_rows, seed=0)
    whole = next(iter(CriteoReader([path], train_rows + test_rows)))
    return whole.take(0, train_rows), whole.take(train_rows, train_rows + test_rows), report.hidden_auc


class Batches:
    """Pre-parsed tensors for both candidates: raw uint64 ids (as int64) and the same ids mapped."""

    def __init__(self, data, codes: np.ndarray, batch_size: int, drop_last: bool):
        import torch
        n = len(data)
        stop = n - n % batch_size if drop_last else n
        self.items = []
        for s in range(0, stop, batch_size):
            e = min(s + batch_size, n)
            self.items.append((torch.from_numpy(np.ascontiguousarray(data.dense[s:e])),
                               torch.from_numpy(np.ascontiguousarray(data.sparse_ids[s:e]).view(np.int64)),
                               torch.from_numpy(np.ascontiguousarray(codes[s:e])),
                               torch.from_numpy(np.ascontiguousarray(data.labels[s:e]))))


def build_models(vocab: int, dim: int):
    import torch
    import torch.nn as nn

    import paramshard as ps
    from paramshard.data import criteo_schema
    from paramshard.models import WideDeep
    torch.manual_seed(0)
    table_opt = ps.optim.Adagrad(lr=TABLE_LR)
    ps_model = WideDeep(criteo_schema(), dim=dim,
                        embedding=lambda name, d: ps.SparseEmbedding(name, d, optimizer=table_opt, init_scale=INIT))
    pt_model = WideDeep(criteo_schema(), dim=dim,
                        embedding=lambda name, d: nn.EmbeddingBag(vocab, d, mode="sum", sparse=True))
    with torch.no_grad():
        for bag in (pt_model.wide, pt_model.deep):
            bag.weight.uniform_(-INIT, INIT)
    pt_model.mlp.load_state_dict(ps_model.mlp.state_dict())          # same dense starting point
    pt_model.dense_wide.load_state_dict(ps_model.dense_wide.state_dict())
    return ps_model, pt_model


class PsRun:
    def __init__(self, children: C.Children, model, mode: str):
        import paramshard as ps
        from paramshard.env import ClusterEnv
        from paramshard.transport.links import ServerLinks
        (addr,) = C.start_paramshard_cluster(children, 1, 1, mode=mode)
        links = ServerLinks([addr], timeout=60.0, who="bench")
        try:
            C.wait_servers(children, links)
        finally:
            links.close()
        env = ClusterEnv(role="trainer", servers=(addr,), num_trainers=1, trainer_id=0, mode=mode, timeout=60.0)
        self.model = model
        self.trainer = ps.Trainer(model, optimizer=ps.optim.Adam(lr=DENSE_LR), env=env)
        self.phase = {"pull rows (in forward)": 0.0, "forward compute": 0.0, "backward": 0.0,
                      "step: push grads, server update, dense reply": 0.0}
        sparse = self.trainer.sparse
        inner = sparse.pull_sparse

        def timed_pull(*a, **k):
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self._pull_s += time.perf_counter() - t0
        sparse.pull_sparse = timed_pull      # instance attribute: only this trainer's client is timed
        self._pull_s = 0.0

    def train(self, items) -> float:
        import torch.nn.functional as F
        t_start = time.perf_counter()
        for dense, ids, _codes, labels in items:
            self._pull_s = 0.0
            t0 = time.perf_counter()
            loss = F.binary_cross_entropy_with_logits(self.model(dense, ids), labels)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            self.trainer.step()
            t3 = time.perf_counter()
            self.phase["pull rows (in forward)"] += self._pull_s
            self.phase["forward compute"] += t1 - t0 - self._pull_s
            self.phase["backward"] += t2 - t1
            self.phase["step: push grads, server update, dense reply"] += t3 - t2
        return time.perf_counter() - t_start

    def predict(self, items) -> np.ndarray:
        import torch
        self.trainer.pull()
        self.model.eval()
        with torch.no_grad():
            out = [torch.sigmoid(self.model(dense, ids)).numpy() for dense, ids, _, _ in items]
        self.model.train()
        return np.concatenate(out)

    def server_rows(self) -> int:
        return sum(t["rows"] for t in self.trainer.server_stats()[0].get("tables", {}).values())

    def close(self) -> None:
        self.trainer.close()


class PtRun:
    def __init__(self, model):
        import torch
        self.model = model
        tables = [p for n, p in model.named_parameters() if n.startswith(("wide.", "deep."))]
        dense = [p for n, p in model.named_parameters() if not n.startswith(("wide.", "deep."))]
        self.opt_sparse = torch.optim.Adagrad(tables, lr=TABLE_LR)
        self.opt_dense = torch.optim.Adam(dense, lr=DENSE_LR)
        self.phase = {"forward": 0.0, "backward": 0.0, "optimizer steps (Adagrad sparse + Adam)": 0.0}

    def train(self, items) -> float:
        import torch.nn.functional as F
        t_start = time.perf_counter()
        for dense, _ids, codes, labels in items:
            t0 = time.perf_counter()
            self.opt_sparse.zero_grad(set_to_none=True)
            self.opt_dense.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(self.model(dense, codes), labels)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            self.opt_sparse.step()
            self.opt_dense.step()
            t3 = time.perf_counter()
            self.phase["forward"] += t1 - t0
            self.phase["backward"] += t2 - t1
            self.phase["optimizer steps (Adagrad sparse + Adam)"] += t3 - t2
        return time.perf_counter() - t_start

    def predict(self, items) -> np.ndarray:
        import torch
        self.model.eval()
        with torch.no_grad():
            out = [torch.sigmoid(self.model(dense, codes)).numpy() for dense, _, codes, _ in items]
        self.model.train()
        return np.concatenate(out)


def backward_variants(items, dim: int, reps: int = 9) -> dict:
    """Backward of SparseEmbedding's pooling over the pulled rows, as the library does it
    (F.embedding_bag with a dense-gradient weight) vs sparse=True followed by .to_dense(),
    which gives the same [unique, dim] gradient. Per step (wide + deep table), median ms."""
    import pandas as pd
    import torch
    import torch.nn.functional as F
    from paramshard.data.features.presets import CRITEO_SPARSE
    NUM_FIELDS = len(CRITEO_SPARSE)
    times = {"dense gradient (before)": [], "sparse=True + to_dense() (library now)": []}
    for k in range(reps + 1):
        _, ids, _, _ = items[k % len(items)]
        batch = ids.shape[0]
        codes, uniq = pd.factorize(ids.numpy().ravel())
        index = torch.from_numpy(codes.astype(np.int64))
        for name, sparse in (("dense gradient (before)", False), ("sparse=True + to_dense() (library now)", True)):
            total = 0.0
            for d, idx in ((1, index.view(batch, NUM_FIELDS)), (dim, index.view(batch * NUM_FIELDS, 1))):
                rows = torch.rand(len(uniq), d, requires_grad=True)
                out = F.embedding_bag(idx, rows, mode="sum", sparse=sparse)
                g = torch.ones_like(out)
                t0 = time.perf_counter()
                out.backward(g)
                grad = rows.grad.to_dense() if sparse else rows.grad
                total += time.perf_counter() - t0
                assert grad.shape == rows.shape
            if k:
                times[name].append(total * 1e3)
    return {k: C.median(v) for k, v in times.items()}


def run_batch_size(args, children, train, test, codes_train, codes_test, vocab, batch_size) -> dict:
    from paramshard.data import auc, logloss
    train_b = Batches(train, codes_train, batch_size, drop_last=True).items
    test_b = Batches(test, codes_test, 8192, drop_last=False).items
    steps = len(train_b) if args.steps is None else min(args.steps, len(train_b))
    train_b = train_b[:steps]
    ps_model, pt_model = build_models(vocab, args.dim)
    runs = {PT: PtRun(pt_model)}
    runs[PS] = PsRun(children, ps_model, args.mode)
    seg_times = {PS: [], PT: []}
    seg_rates = {PS: [], PT: []}
    try:
        segments = [train_b[s:s + args.segment] for s in range(0, steps, args.segment)]
        for k, seg in enumerate(segments):
            order = (PS, PT) if k % 2 == 0 else (PT, PS)
            for c in order:
                t = runs[c].train(seg)
                seg_times[c].append(t)
                seg_rates[c].append(sum(len(b[3]) for b in seg) / t)
            children.check_alive()
        labels = np.concatenate([b[3].numpy() for b in test_b])
        result = {"batch": batch_size, "steps": steps, "segment": args.segment,
                  "samples": sum(len(b[3]) for b in train_b),
                  "phases": {c: dict(runs[c].phase) for c in runs}}
        for c in (PS, PT):
            probs = runs[c].predict(test_b)
            result[c] = {"total_s": sum(seg_times[c]), "median_rate": C.median(seg_rates[c]),
                         "auc": auc(labels, probs), "logloss": logloss(labels, probs)}
        result["server_rows"] = runs[PS].server_rows()
        result["backward_variants"] = backward_variants(train_b, args.dim)
    finally:
        runs[PS].close()
    return result


def report(args, results, hidden_auc, vocab, markdown: bool, note: str, runs_by_batch: dict) -> None:
    seg_text = (f"interleaved in segments of {args.segment} steps" if args.segment
                else "interleaved in about 8 segments per run, " + ", ".join(
                    f"{r['segment']} steps each at batch {r['batch']}" for r in results))
    headers = ["batch", "steps", "candidate", "samples/s (whole run)", "samples/s (median segment)",
               "ratio ps/pt (whole)", "ratio ps/pt (median seg.)", "test AUC", "test logloss"]
    right = [True, True, False, True, True, True, True, True, True]
    rows = []
    for r in results:
        whole = {c: r["samples"] / r[c]["total_s"] for c in (PS, PT)}
        for c in (PS, PT):
            rows.append([str(r["batch"]), str(r["steps"]), c, f"{whole[c]:,.0f}", f"{r[c]['median_rate']:,.0f}",
                         f"{whole[PS] / whole[PT]:.2f}x" if c == PS else "1.00x",
                         f"{r[PS]['median_rate'] / r[PT]['median_rate']:.2f}x" if c == PS else "1.00x",
                         f"{r[c]['auc']:.4f}", f"{r[c]['logloss']:.4f}"])
    pheaders = ["batch", "candidate", "phase", "ms / step", "share"]
    prows = []
    for r in results:
        for c in (PS, PT):
            total = sum(r["phases"][c].values())
            for name, s in r["phases"][c].items():
                prows.append([str(r["batch"]), c, name, f"{s / r['steps'] * 1e3:.1f}", f"{s / total:.0%}"])
    bheaders = ["batch", "pooling backward over the pulled rows (wide + deep)", "ms / step"]
    brows = [[str(r["batch"]), k, f"{v:.1f}"] for r in results for k, v in r["backward_variants"].items()]
    extra = (f"{args.train_rows:,} train rows, {args.test_rows:,} test rows of synthetic Criteo (generate_criteo "
             f"seed 0; hidden-model AUC {hidden_auc:.4f} is the ceiling); vocabulary {vocab:,} ids; WideDeep dim "
             f"{args.dim}, MLP 400-400-1; Adagrad lr {TABLE_LR} on tables, Adam lr {DENSE_LR} on dense; "
             f"paramshard in {args.mode} mode; {seg_text}; paramshard server "
             f"held {results[-1]['server_rows']:,} rows at the end (evaluation pulls create none). "
             f"Target: ratio >= 0.7x.")
    rheaders = ["batch", "ratio ps/pt of each repetition (whole run)", "median", "min-max"]
    rrows = [[str(bs), ", ".join(f"{ratio(r):.2f}x" for r in runs), f"{C.median([ratio(r) for r in runs]):.2f}x",
              f"{min(ratio(r) for r in runs):.2f}-{max(ratio(r) for r in runs):.2f}x"]
             for bs, runs in runs_by_batch.items()]
    C.emit(markdown, [
        (f"CTR end to end: paramshard vs one PyTorch process (the median of {args.repeats} repetitions)",
         headers, rows, right),
        ("Every repetition", rheaders, rrows, [True, False, True, True]),
        ("Where a step's time goes", pheaders, prows, [True, False, False, True, True]),
        ("SparseEmbedding backward: dense vs sparse gradient", bheaders, brows, [True, False, True]),
    ], [extra, note])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-rows", type=int, default=200_000)
    p.add_argument("--test-rows", type=int, default=50_000)
    p.add_argument("--batch-sizes", default="1024,4096")
    p.add_argument("--steps", type=int, default=None, help="at most this many steps (default: one epoch)")
    p.add_argument("--segment", type=int, default=None,
                   help="steps per interleaved segment (default: about 8 segments per run)")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--mode", choices=("sync", "async"), default="sync")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads in this process, for both candidates (default 1: on 2 shared "
                        "vCPUs, with the server process beside it, 2 threads under load ran 2-5x slower)")
    p.add_argument("--repeats", type=int, default=3,
                   help="whole comparisons per batch size, alternating batch sizes; the tables show the run "
                        "with the median ratio, and every run's ratio (default 3)")
    p.add_argument("--markdown", action="store_true", help="print markdown tables for RESULTS.md")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    C.install_sigterm_as_exit()
    note = C.machine_note()
    import pandas as pd
    import torch
    torch.set_num_threads(args.threads)
    import warnings
    warnings.filterwarnings("ignore", message="Sparse invariant checks")   # torch.optim.Adagrad, sparse grads
    children = C.Children()
    workdir = Path(tempfile.mkdtemp(prefix="bench-ctr-"))
    t_start = time.monotonic()
    runs_by_batch: dict[int, list] = {bs: [] for bs in batch_sizes}
    try:
        print(f"generating {args.train_rows + args.test_rows:,} rows ...", flush=True)
        train, test, hidden_auc = load_data(args.train_rows, args.test_rows, workdir)
        # the plain PyTorch user's vocabulary: every distinct hashed id -> 0..vocab-1 (untimed)
        codes, uniques = pd.factorize(np.concatenate([train.sparse_ids, test.sparse_ids]).ravel())
        vocab = len(uniques)
        codes = codes.astype(np.int64).reshape(-1, train.sparse_ids.shape[1])
        codes_train, codes_test = codes[:len(train)], codes[len(train):]
        for rep in range(args.repeats):
            for bs in batch_sizes:
                segment = args.segment or max(1, (len(train) // bs) // 8)
                args_bs = argparse.Namespace(**{**vars(args), "segment": segment})
                print(f"repeat {rep + 1}/{args.repeats}, batch {bs}: training both candidates, interleaved in "
                      f"segments of {segment} steps ...", flush=True)
                runs_by_batch[bs].append(run_batch_size(args_bs, children, train, test, codes_train, codes_test,
                                                        vocab, bs))
                r = runs_by_batch[bs][-1]
                print(f"  paramshard {r['samples'] / r[PS]['total_s']:,.0f} samples/s, PyTorch "
                      f"{r['samples'] / r[PT]['total_s']:,.0f} samples/s; AUC {r[PS]['auc']:.4f} vs "
                      f"{r[PT]['auc']:.4f}", flush=True)
                children.stop_all()
    finally:
        children.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()[0]
    note += (f"; load average {load:.2f} at end; torch threads {torch.get_num_threads()}; "
             f"{time.monotonic() - t_start:.0f} s")
    results = [median_run(runs_by_batch[bs]) for bs in batch_sizes]
    report(args, results, hidden_auc, vocab, args.markdown, note, runs_by_batch)
    return 0


def ratio(r: dict) -> float:
    return r[PT]["total_s"] / r[PS]["total_s"]        # samples/s of paramshard over PyTorch's


def median_run(runs: list) -> dict:
    """The repetition whose whole-run ratio is the median (a real run, not a blend)."""
    return sorted(runs, key=ratio)[(len(runs) - 1) // 2]


if __name__ == "__main__":
    sys.exit(main())
