"""`bert ner`: named-entity recognition on CoNLL-2003 (the BERT paper's section 5.3 recipe).

The original repository has no NER script (users asked for one in its issues); this one takes the
common fine-tuning flags of `bert classify` (`bert.finetune`). Data: `--data_dir` holds `train.txt`, `valid.txt` and
`test.txt` (CoNLL-2003: `token POS chunk NER` per line, a blank line between sentences, `-DOCSTART-`
lines between documents; any layout with the word first and the tag last works, as long as every line
of a file has the same number of columns). `bert.tasks.ner` reads them and puts each word's label on
its first sub-token; other positions are ignored by the loss. Sentences longer than `--max_seq_length`
are split into windows at word boundaries, so every word gets a prediction. `num_train_steps` counts
sentences, as run_squad counts examples.

Model: `BertForTokenClassification` (dropout, then a linear layer on every token). Labels: the nine
CoNLL-2003 tags (`O`, `B-/I-` `MISC`, `PER`, `ORG`, `LOC`) or `--labels`; saved with the model.

Outputs: `eval_results.txt` with conlleval's entity-level `eval_precision`, `eval_recall`, `eval_f1`,
the word-level tag accuracy `eval_accuracy`, `eval_loss` (mean cross-entropy per labelled word),
`loss` and `global_step`; `eval_predictions.txt` (the dev set); and with `--do_predict`
`test_predictions.txt` (`token gold pred` per line, a blank line after each sentence: conlleval's
input) and `test_results.txt` with the same scores on the test set (`test_f1`, ...).

Distillation (`--teacher=OUTPUT/model` of a larger `bert ner` run, `bert.distillation`): the teacher's
logits at each word's first sub-token are soft labels (per-token KL at `--temperature`, weighted by
`--distill_alpha` against the gold tags); `--transfer_file` adds sentences in the same layout (the word
first; tags, if any, ignored) labelled by the teacher alone. The teacher reads the student's word pieces,
so it must share the student's vocabulary and casing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bert.flags import DistillArgs, FinetuneArgs
from bert.tasks.ner import NerTask


@dataclass(kw_only=True)
class NerArgs(FinetuneArgs, DistillArgs):
    """Fine-tune and evaluate BERT on named-entity recognition (CoNLL-2003 files).

    Resumes from the newest checkpoint in --output_dir when there is one.
    """

    labels: str | None = field(
        default=None,
        metadata={
            "run_defining": "model",
            "help": "The tags in id order, comma separated. Default: the nine CoNLL-2003 tags.",
        },
    )
    train_file: str = field(
        default="train.txt", metadata={"run_defining": "train", "help": "Training file in --data_dir."}
    )
    dev_file: str = field(default="valid.txt", metadata={"help": "Dev file in --data_dir (--do_eval)."})
    test_file: str = field(default="test.txt", metadata={"help": "Test file in --data_dir (--do_predict)."})


def run_ner(args: NerArgs) -> dict[str, Any]:
    """Train, evaluate and/or predict (see the module docstring); returns the runner's summary."""
    # Imported here, not at the top, so that a flag error is reported before torch loads (bert.cli parses first).
    from bert.finetune import run_finetune

    return run_finetune(args, NerTask(args))
