"""Models on raw text: load a model once, then classify, tag, answer, choose, embed or fill masks, batch
after batch.

    predictor = Predictor.from_pretrained("out/mrpc/model")
    predictor.classify([("He said so.", "He did say that.")], top_k=2)

`Predictor.from_pretrained` reads a model in any format `bert.checkpoint.read_checkpoint` reads: the
native (= transformers) layout, a directory with `config.json`, `model.safetensors` or
`pytorch_model.bin`, `vocab.txt` and `tokenizer_config.json`, or an original TF checkpoint with
`bert_config.json` and `vocab.txt` beside it. The head is the one `config.json`'s `architectures[0]`
names; without it (TF checkpoints), the one the weights hold. Inputs are tokenized with the model's
own settings (`tokenizer_config.json`: `do_lower_case`, `tokenize_chinese_chars`, `strip_accents`).

What each head offers (every model also offers `embed`, `token_embeddings`, `similarity`, `tokenize` with
character offsets and `decode`; `rank` scores by a cross-encoder, else by cosine similarity):
- BertForSequenceClassification: `classify` (single-label, multi-label or regression); with one label, a
  cross-encoder's `rank`;
- BertForTokenClassification: `ner` (entity spans) and `tag_words` (a tag per word);
- BertForQuestionAnswering: `answer`;
- BertForMultipleChoice: `choose`;
- BertForPreTraining / BertForMaskedLM: `fill_mask`;
- BertModel: `embed`.

Features and post-processing are the fine-tuning tasks' own, so answers equal the task commands':
`bert.tasks.glue` (classification: truncated as run_classifier.py does, or read in windows whose logits
are pooled, as the model was fine-tuned),
`bert.tasks.ner.convert_ner_examples_to_features` and `word_predictions` (a word's tag is its first
piece's), `bert.tasks.squad` (doc-stride windows, run_squad.py's `write_predictions` n-best rules over
all windows), `bert.tasks.swag`. Each call sorts its sequences by length, runs them in batches padded
only to the batch's longest (the model skips padding itself when a batch has much of it), and returns
the results in input order, under `torch.inference_mode()` with the model in eval mode.

Config keys read from `config.json` (the fine-tuning commands write them; transformers' names where it
has them), each with a fallback: `problem_type` ("single_label_classification", "regression" or
"multi_label_classification"; default regression for one output, else single-label), `id2label`
(default LABEL_0, LABEL_1, ...), `label_thresholds` ({label: threshold} for multi-label, default 0.5),
`max_seq_length` (the fine-tuning length; default 384 for question answering, 128 for the other heads,
the position table's size for embeddings and fill-mask; never above `max_position_embeddings`), for
classification `long_document` ("truncate"), `doc_stride` (128) and `window_pooling` ("mean") (`bert
classify --long_document=windows` saves them; `Predictor.set_windows` overrides them), and for question
answering `doc_stride` (128), `max_query_length` (64, or half of `max_seq_length` when that is
shorter than 128), `n_best_size` (20), `max_answer_length` (30), `version_2_with_negative` (false) and
`null_score_diff_threshold` (0.0). A sentence-transformers
model directory (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`) sets `embed`'s
default pooling, normalisation and length, so it gives what sentence-transformers gives.

`embed`, `token_embeddings`, `similarity`, `classify` (with `classification_logits`), `rank`, `tag_words`
and `ner`, `answer` and `fill_mask` are each a prepare and a run: `prepare_embeddings`,
`prepare_similarity`, `prepare_classification`, `prepare_rank`, `prepare_tagging`, `prepare_answer` and
`prepare_fill_mask` tokenize the inputs once and apply the length rule (cut, or refused without
`truncate`; fill-mask's refusal waits for the run), returning a `Prepared` (the sequences that will run
and their `tokens`), which `run_embed`, `run_token_embeddings`, `run_similarity`, `run_classify`,
`run_classification_logits`, `run_rank`, `run_tag_words`, `run_ner`, `run_answer` and `run_fill_mask`
run; `Prepared.join` makes one of several prepared with equal options (the server's queue counts a
request's tokens in its `Prepared` and runs the requests of a batch as one call). `UnitVectorCache` keeps an
embedding model's unit vectors of prepared texts by token ids, bounded in bytes, for callers whose texts recur.

Character offsets (`start`, `end`) are Python string indices (code points) into the input, `end`
exclusive. A `Predictor` is safe to share between threads: calls run one at a time (a lock), since the
model and the tokenizer's memo are shared.

The package, one job a module: `core` (loading through `bert.loading`, batching, counting truncations,
the tokenizer's calls, `Prepared`), `common` (input checks, the settings only one head reads: `ClassificationHead`,
`TaggingHead`, `AnswerSettings`), `classification`, `spans` (NER, question answering, multiple choice),
`embeddings`, `fill_mask`, `st_config` (a sentence-transformers directory's files) and `predictor`
(`Predictor`: the core with every task, and `rank`). The options' rules (`top_k`, `dimensions`,
`truncation_direction`, pooling, the task of each architecture) are `bert.request_rules`', which the commands
and the server read too.
"""

from __future__ import annotations

from bert.inference.common import LONGER_ADVICE, WINDOWS_ADVICE, AnswerSettings, ClassificationHead, TaggingHead
from bert.inference.core import Prepared
from bert.inference.embeddings import UnitVectorCache, cosine_similarity
from bert.inference.predictor import Predictor
from bert.inference.st_config import SentenceTransformersConfig, read_sentence_transformers_config
from bert.request_rules import POOLINGS, TASKS, TRUNCATION_DIRECTIONS
from bert.tasks.common import CLASSIFICATION, EMBEDDINGS, FILL_MASK, MULTIPLE_CHOICE, NER, QUESTION_ANSWERING

__all__ = [
    "CLASSIFICATION",
    "EMBEDDINGS",
    "FILL_MASK",
    "LONGER_ADVICE",
    "MULTIPLE_CHOICE",
    "NER",
    "POOLINGS",
    "QUESTION_ANSWERING",
    "TASKS",
    "TRUNCATION_DIRECTIONS",
    "WINDOWS_ADVICE",
    "AnswerSettings",
    "ClassificationHead",
    "Predictor",
    "Prepared",
    "SentenceTransformersConfig",
    "TaggingHead",
    "UnitVectorCache",
    "cosine_similarity",
    "read_sentence_transformers_config",
]
