"""``zoo train`` options: their choices, their defaults, and the checks that need no store.

The CLI takes its ``--model`` / ``--task`` choices and every default from here; this module
imports no PyTorch, so the ``zoo`` command starts without it. :func:`check_options` refuses values
and combinations that cannot train before any store is read or anything is written; what needs the
store (targets, labels, batch sizes against split sizes) is checked in :mod:`dws.tasks.prepare`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path

from zoo.options import DEFAULT_MAX_MEMORY, require_at_least, require_positive

# the models and tasks `zoo train` offers; dws.tasks.models and dws.tasks.objectives build them
# (tests/test_train.py checks that the three agree)
MODELS = ("dwsnet", "mlp", "mlp-perm", "mlp-align", "inr2vec", "transformer", "stats", "nfn-np", "nfn-hnp",
          "ng-gnn", "ng-transformer", "scalegmn", "scalegmn-b")
# Zhou et al.'s neural functionals (dws/nfn), sized to the DWSNet like the baselines; invariant only for now
NFN_MODELS = ("nfn-np", "nfn-hnp")
# Kofinas et al.'s neural graphs (dws/ng): PNA and the relational transformer at the reference's width (in
# proportion to the DWSNet's channels); invariant only
NG_MODELS = ("ng-gnn", "ng-transformer")
# Kalogeropoulos et al.'s ScaleGMN (dws/scalegmn): forward and bidirectional; invariant only; the paper's width
# (128 at the DWSNet's default 48 channels, in proportion otherwise) and the symmetry of the store's activation
SCALEGMN_MODELS = ("scalegmn", "scalegmn-b")
# networks per step when --batch-size is not given: the graph models carry a feature vector per weight
# through several MLPs, ~25-90 MB of activations per (2, 32, 32, 1) SIREN, so 512 needs 12-45 GB
DEFAULT_BATCH_SIZE = 512
MODEL_BATCH_SIZES = {name: 64 for name in NG_MODELS + SCALEGMN_MODELS}
# A model's activations in the --max-memory plan (dws.stream.memory.activation_bytes): the bytes autograd
# saves for the backward, times (training step, no-grad evaluation). Peak RSS growth over the saved bytes,
# measured on (2, 16, 16, 1) SIRENs at batch 256 (graph models 64), one step in a fresh process:
# 1.8-2.4 / 0.25-0.66 for the DWSNet and the baselines (up to 2.8 over a whole `zoo train`, whose
# allocator keeps freed blocks); 3.1-3.5 / 1.1 for the NFNs, whose einsums hold temporaries that are
# not saved; 0.94-1.14 / 0.06-0.29 for the graph models (tests/test_memory_gaps.py checks them)
ACTIVATION_PEAK = {name: (4.0, 1.5) if name in NFN_MODELS else (1.5, 0.5) if name in NG_MODELS + SCALEGMN_MODELS
                   else (3.0, 1.0) for name in MODELS}
# The symmetry each model is exactly invariant (or equivariant) to, which --normalize orbit pools the
# statistics over (dws.stream.orbit): "permutation": hidden-neuron permutations; "permutation+scale":
# also the activation's own neuron scaling (sign flips for sine and tanh, positive scales for ReLU);
# None: no claim (the baselines; mlp-perm and mlp-align only approximate permutation invariance, and
# stats, invariant by construction, undoes the per-entry normalization it keeps before summarizing).
# tests/test_normalize_orbit.py checks that every name in MODELS has an entry.
CLAIMED_SYMMETRY = {
    "dwsnet": "permutation", "nfn-np": "permutation", "nfn-hnp": "permutation",
    "ng-gnn": "permutation", "ng-transformer": "permutation",
    "scalegmn": "permutation+scale", "scalegmn-b": "permutation+scale",
    "mlp": None, "mlp-perm": None, "mlp-align": None, "inr2vec": None, "transformer": None, "stats": None,
}
# What each model computes, versioned: bumped when a code change makes the same options build another
# function (a layer added, a default moved). A run of another version is neither resumed nor reused by
# the pipelines (dws.tasks.prepare.resume_settings, dws.tasks.rundir.finished_run); 1 where absent, as
# for every run saved before versions existed. History: nfn-* 2 (2026-11-27): the reference's channel
# dropout after every layer, and its Fourier scale matched to standardized inputs (weight_std).
# ng-gnn 2 (2026-11-28): layer norm over each network's nodes and channels (the reference's PyG
# LayerNorm in graph mode), not over each node's channels (dws.ng.pna.GraphLayerNorm).
MODEL_VERSIONS = {"nfn-np": 2, "nfn-hnp": 2, "ng-gnn": 2}


def model_version(model: str) -> int:
    """:data:`MODEL_VERSIONS`' entry of ``model``."""
    return MODEL_VERSIONS.get(model, 1)


def recorded_version(record: dict) -> int:
    """The model version a run's config (or a table's cell) records: 1 where absent, as in everything
    saved before versions existed."""
    return record.get("model_version", 1)


# --normalize: per-entry statistics of the train split (DWSNets' code; the recorded numbers), or those
# statistics pooled over the claimed symmetry's orbits, so normalization commutes with it
NORMALIZATIONS = ("entry", "orbit")
TASKS = ("classify", "regress", "ssl", "adapt")
ADAPT_MODELS = ("dwsnet", "mlp", "mlp-perm", "mlp-align")  # the models whose output can be a weight space
# the DWSNet's size when --hidden-channels / --input-reduction are not given: the INR classifier's
# 48 channels and no reduction, except for adapt, whose default is the paper's adapter (16 channels,
# its 3072 image inputs reduced to d_0' = 16)
MODEL_DEFAULTS = dict(hidden_channels=48, input_reduction=None)
# --task adapt and classifier zoos: the paper's 32 input networks a step (its appendix). At 512 a
# classifier's per-weight features need ~11-28 GiB of activations, over the default --max-memory.
CLASSIFIER_BATCH_SIZE = 32
TASK_MODEL_DEFAULTS = {"adapt": dict(hidden_channels=16, input_reduction=16, batch_size=CLASSIFIER_BATCH_SIZE)}
# What `zoo train STORE` does when --task is not given: the paper's experiment for the store's kind
# (its manifest's `targets`). Classifier zoos also get the paper's DWSNet for classifiers (16 channels,
# d_0 reduced to d_0' = 16; without it a 784-input DWSNet of 48 channels has ~9 billion parameters)
# and no weight augmentation (noise and dropout change a classifier's function, so its accuracy, the target).
TASK_OF_TARGETS = {("label",): "classify", ("frequency",): "regress", ("amplitude", "frequency"): "ssl",
                   ("test_accuracy",): "regress"}
CLASSIFIER_ZOO_DEFAULTS = dict(target="test_accuracy", hidden_channels=16, input_reduction=16, augment=False,
                               batch_size=CLASSIFIER_BATCH_SIZE)
# how the DWSNet runs (dws.nn.fast.accelerate's backends; tests/test_train.py checks they agree):
# auto = native C kernels where they apply, else fused PyTorch; plain = the paper's modules as written
BACKENDS = ("auto", "native", "pytorch", "plain")
# the training step's arithmetic (--precision; dws.tasks.trainer.AUTOCAST_DTYPES): fp32, or bfloat16 autocast.
# No float16: it needs loss scaling, which bfloat16 (float32's exponent range) does not
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainOptions:
    store: str
    model: str = "dwsnet"
    task: str | None = None  # None: the store's (TASK_OF_TARGETS; with_task_defaults)
    target: str | None = None
    out: str | None = None
    epochs: int = 10
    batch_size: int | None = None  # None: the model's (model_defaults: 64 for the graph models, else 512)
    lr: float | None = None  # None: the paper's search over PAPER_LRS on the validation split
    seeds: int = 1
    seed: int = 0
    hidden_channels: int | None = None  # the DWSNet's (None: the task's, with_task_defaults); baselines are sized to it
    num_layers: int = 4  # likewise
    # the DWSNet's LIN(d_0, d_0') before its first layer (the paper's d_0' = 16 for 784-input classifiers);
    # likewise sets the DWSNet the baselines are sized to. None: the task's (no reduction; adapt: 16)
    input_reduction: int | None = None
    dropout: float = 0.0
    bn: bool = True
    blocks: str = "all"
    pool: str = "max"
    augment: bool | None = None  # None: on, except for classifier zoos (CLASSIFIER_ZOO_DEFAULTS)
    # regress: the model's outputs are read as targets standardized with the train split's mean and std
    # (dws.tasks.models.TargetScale); False: raw targets, as before 2026-11-25
    standardize_target: bool = True
    precise_bn: int = 4096  # BN statistics re-estimated on this many clean train networks per evaluation; 0: off
    loader_workers: int = 0
    compile: bool = False  # the training step through torch.compile (speed only: same function)
    # the training step's arithmetic (PRECISIONS): fp32, or bf16 autocast (products in bfloat16; parameters,
    # optimizer and evaluation stay float32). Not speed only: the trained function differs beyond rounding
    precision: str = "fp32"
    device: str = "auto"
    patience: int | None = None
    # train on N networks of the train split only, spread over it: a fixed random subset (stratified by
    # label where there is one), the same for every seed and nested across N (dws.stream.rows.limit_mask)
    train_limit: int | None = None
    # train on each item's first K views (a zoo generated with --views >= K); validation and test then use
    # each item's first view, so runs with different K are selected and tested on the same networks
    train_views: int | None = None
    progress: bool = True
    workers: int = 1  # > 1: data-parallel training on Ray Train (dws/tasks/distributed.py)
    address: str | None = None  # Ray cluster to join with workers > 1 (None: a local one)
    backend: str = "auto"  # how the DWSNet runs (BACKENDS); same function, different speed
    resume: bool = True  # continue an unfinished run in the run directory (same settings); False: start over
    # also save the training's state within an epoch every M minutes (0: after every epoch only; speed only)
    checkpoint_minutes: float = 10.0
    data_root: str | None = None  # adapt: the classifiers' images (default: the folder the store recorded)
    image_batch: int = 128  # adapt: images per classifier and step
    # bytes the process may hold (dws.stream.memory.plan_memory): which splits are held, the shuffle window's size
    max_memory: int = DEFAULT_MAX_MEMORY
    normalize: str | None = None  # NORMALIZATIONS; None: orbit where the model claims a symmetry, else entry
    # the training recipes of the newer models' reference code (off: the paper's protocol, every table cell):
    # AdamW's weight decay, the lr raised linearly over the first N steps, the gradients' global norm clipped,
    # AdamW's AMSGrad variant
    weight_decay: float = 5e-4
    warmup_steps: int = 0
    clip_grad: float | None = None
    amsgrad: bool = False


DEFAULTS = {f.name: f.default for f in fields(TrainOptions) if f.name != "store"}

# options that shape the DWSNet's layers themselves: a baseline has no such layers (it is only sized
# to the DWSNet of --hidden-channels / --num-layers), so with a baseline they are refused, not ignored
DWSNET_ONLY = {
    "blocks": ("--blocks", "the baselines have no DWS blocks"),
    "bn": ("--no-bn", "the baselines always use batch norm, as in the paper"),
    "pool": ("pool", "the baselines have no DWS pooling"),
    "backend": ("--backend", "the baselines run on PyTorch operators only"),
}


def check_options(opts: TrainOptions) -> None:
    """Refuse option values that cannot train before anything is read or created (ValueError)."""
    require_at_least({"--epochs": (opts.epochs, 1), "--batch-size": (opts.batch_size, 1), "--seeds": (opts.seeds, 1),
                      "--hidden-channels": (opts.hidden_channels, 1), "--num-layers": (opts.num_layers, 1),
                      "--loader-workers": (opts.loader_workers, 0), "--workers": (opts.workers, 1),
                      "--patience": (opts.patience, 1), "--train-limit": (opts.train_limit, 1),
                      "--train-views": (opts.train_views, 1),
                      "--precise-bn": (opts.precise_bn, 0), "--input-reduction": (opts.input_reduction, 1),
                      "--image-batch": (opts.image_batch, 1), "--max-memory": (opts.max_memory, 1),
                      "--warmup-steps": (opts.warmup_steps, 0)})
    require_positive("--lr", opts.lr)
    require_positive("--clip-grad", opts.clip_grad)
    if not opts.checkpoint_minutes >= 0:
        raise ValueError(f"--checkpoint-minutes must be >= 0 (0: after every epoch only), got {opts.checkpoint_minutes}")
    if not opts.weight_decay >= 0:
        raise ValueError(f"--weight-decay must be >= 0, got {opts.weight_decay}")
    if not 0 <= opts.dropout < 1:
        raise ValueError(f"--dropout must be in [0, 1), got {opts.dropout}")
    for flag, value, choices in (("--model", opts.model, MODELS), ("--task", opts.task, TASKS),
                                 ("--backend", opts.backend, BACKENDS), ("--precision", opts.precision, PRECISIONS)):
        if value not in choices and not (flag == "--task" and value is None):
            raise ValueError(f"{flag} {value!r} is not one of {', '.join(choices)}")
    if opts.model != "dwsnet":
        for name, (flag, why) in DWSNET_ONLY.items():
            if getattr(opts, name) != DEFAULTS[name]:
                raise ValueError(f"{flag} shapes DWSNet layers and --model {opts.model} has none ({why}); "
                                 f"drop {flag}, or train --model dwsnet")
    if opts.task == "adapt":
        if opts.model not in ADAPT_MODELS:
            raise ValueError(f"--task adapt needs a model whose output is a weight space ({', '.join(ADAPT_MODELS)}); "
                             f"--model {opts.model} outputs a vector")
        if opts.target is not None:
            raise ValueError("--task adapt has no --target: each network is judged by its own classes' accuracy")
    else:
        for flag, name in (("--data-root", "data_root"), ("--image-batch", "image_batch")):
            if getattr(opts, name) != DEFAULTS[name]:
                raise ValueError(f"{flag} is an option of --task adapt (the classifiers' images)")
    check_normalization(opts)
    if opts.address is not None and opts.workers < 2:
        raise ValueError(f"--address {opts.address} joins a Ray cluster for data-parallel training, which needs "
                         f"--workers N with N > 1 (got --workers {opts.workers})")
    from zoo.devices import resolve_device  # imports torch

    resolve_device(opts.device)


def with_task_defaults(opts: TrainOptions) -> TrainOptions:
    """``opts`` with what was left unset filled in: the task and its target from the store's kind,
    then the model sizes and the augmentation from the store and the task (see :func:`store_defaults`)."""
    return store_defaults(opts)[0]


def check_normalization(opts: TrainOptions) -> None:
    """``--normalize``: one of NORMALIZATIONS; orbit only for a model that claims a symmetry; none for adapt."""
    if opts.normalize is None:
        return
    if opts.normalize not in NORMALIZATIONS:
        raise ValueError(f"--normalize {opts.normalize!r} is not one of {', '.join(NORMALIZATIONS)}")
    if opts.task == "adapt":
        raise ValueError("--normalize does not apply to --task adapt: its models take raw networks (the adapter "
                         "normalizes each tensor itself); drop --normalize")
    if opts.normalize == "orbit" and CLAIMED_SYMMETRY.get(opts.model) is None:
        raise ValueError(f"--normalize orbit pools the statistics over the symmetry a model claims, and --model "
                         f"{opts.model} claims none; use --normalize entry")


def model_defaults(opts: TrainOptions) -> TrainOptions:
    """``opts`` with what depends on the model alone resolved: the batch size, then ``--normalize``."""
    if opts.batch_size is None:
        opts = replace(opts, batch_size=MODEL_BATCH_SIZES.get(opts.model, DEFAULT_BATCH_SIZE))
    return default_normalization(opts)


def default_normalization(opts: TrainOptions) -> TrainOptions:
    """``opts`` with ``--normalize`` resolved: orbit where the model claims a symmetry, else entry
    (adapt: left unset, its models take raw networks)."""
    if opts.normalize is not None or opts.task == "adapt":
        return opts
    return replace(opts, normalize="orbit" if CLAIMED_SYMMETRY.get(opts.model) else "entry")


def store_defaults(opts: TrainOptions) -> tuple[TrainOptions, str | None]:
    """:func:`with_task_defaults`'s options, and one line saying what followed the store (None when
    nothing did). Reads the store's manifest (not its networks) where something is left unset."""
    unset = {name for name in ("task", "target", "hidden_channels", "input_reduction", "augment", "batch_size")
             if getattr(opts, name) is None}
    opts = model_defaults(opts)  # the model's, where the store has none (the batch size)
    if not unset:
        return opts, None
    from zoo.store.manifest import read_manifest  # lazily: `import cli` reads no store code

    manifest = read_manifest(opts.store)
    targets = tuple(manifest.get("targets") or ())
    classifiers = (manifest.get("architecture") or {}).get("family") == "mlp-classifier"
    chosen = {}
    if opts.task is None:
        chosen["task"] = TASK_OF_TARGETS.get(targets, "classify" if "label" in targets else "regress")
    task = opts.task or chosen["task"]
    defaults = {**MODEL_DEFAULTS, "augment": True, **TASK_MODEL_DEFAULTS.get(task, {})}
    if classifiers and task != "adapt":
        defaults.update(CLASSIFIER_ZOO_DEFAULTS if task == "regress" else
                        {k: v for k, v in CLASSIFIER_ZOO_DEFAULTS.items() if k != "target"})
    chosen.update({name: value for name, value in defaults.items() if name in unset and name != "task"})
    inputs = ((manifest.get("architecture") or {}).get("widths") or [None])[0]
    if chosen.get("input_reduction") and inputs and inputs <= chosen["input_reduction"]:
        chosen["input_reduction"] = None  # a default d_0' that would not reduce the inputs is left out
    resolved = replace(opts, **chosen)
    # say what the store chose: the task (and target) where --task was not given, and for classifier
    # zoos the DWSNet and augmentation that differ from the INR zoos' defaults
    shown = {k: chosen[k] for k in ("task", "target", "hidden_channels", "input_reduction", "augment", "batch_size")
             if chosen.get(k) is not None and (k in ("task", "target") or classifiers)
             and (k != "augment" or not chosen[k])}
    if not shown or not ("task" in chosen or classifiers):
        return resolved, None
    flags = " ".join("--no-augment" if k == "augment" else f"--{k.replace('_', '-')} {v}" for k, v in shown.items())
    why = ": the paper's generalization prediction" if classifiers and resolved.task == "regress" else ""
    return resolved, (f"note: {flags} (from the store: a {manifest.get('kind', 'weight')} zoo{why}); pass "
                      f"{'--task' if len(shown) == 1 else 'these options'} to choose otherwise")


def default_run_dir(opts: TrainOptions) -> Path:
    task = opts.task or with_task_defaults(opts).task
    return Path("runs") / f"{Path(opts.store).name}-{opts.model}-{task}"
