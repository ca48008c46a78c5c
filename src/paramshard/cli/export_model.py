"""`paramshard export-model`: a checkpoint -> one file a model loads without servers."""
from __future__ import annotations

HELP = ("write a checkpoint's trained model (dense parameters and sparse tables) to one file that "
        "paramshard.load_model runs without servers")
EXAMPLE = "paramshard export-model runs/ckpt --out model.pt"


def add_arguments(p) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="a checkpoint directory (its latest checkpoint) or one step-NNNNNNNN directory in it")
    p.add_argument("--out", required=True, metavar="FILE", help="the model file to write (replaced atomically)")


def run(args) -> int:
    from ..serving import export_model    # torch: imported only when this command runs

    model = export_model(args.checkpoint, args.out)
    rows = sum(len(t["ids"]) for t in model["sparse"].values())
    numbers = sum(t.numel() for t in model["dense"].values())
    print(f"wrote {args.out}: step {model['step']} of {model['checkpoint']}, {len(model['dense'])} dense "
          f"parameters ({numbers:,} numbers), {len(model['sparse'])} sparse tables ({rows:,} rows)")
    return 0
