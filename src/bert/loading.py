"""The one loader of saved models: which head class a model directory or checkpoint builds, and that class
with the checkpoint's weights.

`ARCHITECTURES` is the table: `config.json`'s `architectures[0]` (or, for the original's checkpoints
without one, the head the weights hold: `bert.checkpoint.architecture`) -> the `bert.modeling` class
built. `bert.inference.Predictor`, `bert export` and a training run starting from a teacher's layers read
their models here, so a directory without a config, a head without its weights or an architecture a user
does not support is refused by one rule and one message.

`bert.checkpoint.load_pretrained` (`BertPreTrainedModel.from_pretrained`) stays the loader of a class the
caller names, whose new heads are drawn at random: that is fine-tuning's start, not a saved model being used.
Both build through `bert.checkpoint.uninitialised`, drawing no weight the checkpoint gives.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from bert.checkpoint import Checkpoint, architecture, load_into, read_checkpoint, uninitialised
from bert.errors import InputError
from bert.modeling import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertPreTrainedModel,
)

# architectures[0] -> the class built. Ours has no BertForMaskedLM: its weights (encoder and
# cls.predictions) load into BertForPreTraining, whose next-sentence head then stays unused.
ARCHITECTURES: dict[str, type[BertPreTrainedModel]] = {
    "BertForSequenceClassification": BertForSequenceClassification,
    "BertForTokenClassification": BertForTokenClassification,
    "BertForQuestionAnswering": BertForQuestionAnswering,
    "BertForMultipleChoice": BertForMultipleChoice,
    "BertForPreTraining": BertForPreTraining,
    "BertForMaskedLM": BertForPreTraining,
    "BertModel": BertModel,
}
# The command that trains each fine-tuned head: what a model lacking that head should be run through.
FINE_TUNING_COMMANDS = {
    "BertForSequenceClassification": "bert classify",
    "BertForTokenClassification": "bert ner",
    "BertForQuestionAnswering": "bert squad",
    "BertForMultipleChoice": "bert swag",
}
MLM_KEY = "cls.predictions.transform.dense.weight"
# Weights a masked-LM model may lack: its task never reads them.
_UNUSED_BY_MASKED_LM = ("cls.seq_relationship.", "bert.pooler.")


def read_model_checkpoint(
    path: str | os.PathLike, *, verify: bool = True, need_vocab: bool = False, name: str | None = None
) -> Checkpoint:
    """`bert.checkpoint.read_checkpoint`, refusing weights without a config beside them (and, with
    `need_vocab`, without a vocab.txt); `name` is how the error names `path` (e.g. the flag)."""
    ckpt = read_checkpoint(path, verify=verify)
    name = name or str(path)
    if ckpt.config is None:
        raise InputError(f"{name}: no config.json or bert_config.json beside the weights; add the model's config")
    if need_vocab and ckpt.vocab_file is None:
        raise InputError(f"{name}: no vocab.txt beside the weights; add the model's vocabulary")
    return ckpt


def has_pooler(ckpt: Checkpoint) -> bool:
    return any(k.endswith("pooler.dense.weight") for k in ckpt.state_dict)


def has_mlm_head(ckpt: Checkpoint) -> bool:
    return MLM_KEY in ckpt.state_dict


def build_model(ckpt: Checkpoint, name: str) -> BertPreTrainedModel:
    """The `ARCHITECTURES[name]` model with the checkpoint's weights, in fp32 on the CPU, in train mode.

    It is built with `torch.nn.init`'s functions as no-ops and given zeroed storage, which skips the random
    initialisation (minutes for BERT-Base on a busy 2-core machine, all of it overwritten by the loading);
    weights that share a tensor (the masked-LM decoder and the word embeddings) are tied again. Only weights
    the task never reads may be missing from the checkpoint: the next-sentence head and the pooler of a
    masked-LM model.
    """
    assert ckpt.config is not None  # read_model_checkpoint refuses weights without one
    model_class = ARCHITECTURES[name]
    if model_class is BertModel:
        model: BertPreTrainedModel = uninitialised(BertModel, ckpt.config, add_pooling_layer=has_pooler(ckpt))
    elif model_class in (BertForSequenceClassification, BertForTokenClassification):
        model = uninitialised(model_class, ckpt.config, num_labels=_num_labels(ckpt, name))
    else:
        model = uninitialised(model_class, ckpt.config)
    first_name: dict[int, str] = {}
    tied = [(n, first_name.setdefault(id(p), n)) for n, p in model.named_parameters(remove_duplicate=False)]
    for n, source in tied:
        if n != source:
            owner, _, attr = n.rpartition(".")
            setattr(model.get_submodule(owner), attr, model.get_parameter(source))
    loaded = load_into(model, ckpt)
    unused_when_missing = _UNUSED_BY_MASKED_LM if model_class is BertForPreTraining else ()
    missing = [n for n, source in tied if n == source and n not in loaded and not n.startswith(unused_when_missing)]
    if missing:
        raise InputError(
            f"{ckpt.source}: the weights lack {len(missing)} of {name}'s (e.g. {missing[0]}); pass the "
            "directory of a complete model"
        )
    return model


def _num_labels(ckpt: Checkpoint, name: str) -> int:
    head = ckpt.state_dict.get("classifier.bias")
    if head is None:
        raise InputError(
            f"{ckpt.source}: config.json says {name}, but the weights have no classifier; fine-tune it with "
            f"`{FINE_TUNING_COMMANDS[name]}`"
        )
    return int(head.shape[0])


def load_model(
    path: str | os.PathLike, supported: Collection[str] = ARCHITECTURES, user: str = "this project runs"
) -> tuple[BertPreTrainedModel, Checkpoint]:
    """The model a directory (or any checkpoint `read_checkpoint` reads) holds, in eval mode, with its
    checkpoint; `supported` (the architectures' names, a subset of `ARCHITECTURES`) and `user` ("export
    supports") make the error for any other."""
    ckpt = read_model_checkpoint(path)
    return build_model(ckpt, architecture(ckpt, supported, user)).eval(), ckpt
