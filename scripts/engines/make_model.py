"""Writes the tiny Llama that the local vLLM engines serve (run with the engines' venv).

Owns: the model directory's files: config.json, generation_config.json,
model.safetensors (random bf16 weights from a fixed seed), tokenizer.json (a byte-level
BPE of exactly the model's 32,000 ids, trained here on a corpus this script generates
from a fixed seed), tokenizer_config.json (BOS/EOS, a small Jinja chat template) and
special_tokens_map.json. The same script writes the same bytes every run: weights, vocab,
merges, everything (`--check` proves it by writing twice and comparing).
Never: downloads anything (no hub is reachable), reads a random source other than its
seeds, or writes outside the directory it is given.

Usage: python make_model.py OUT_DIR [--check]
"""

import hashlib
import json
import os
import random
import sys
import tempfile

# Fixed before torch and tokenizers start their thread pools: one thread, one order.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 20261127
VOCAB_SIZE = 32000
MAX_MODEL_LEN = 2048

# Ids 0..6; vLLM, transformers and the Rust `tokenizers` crate all read them from
# tokenizer.json / tokenizer_config.json.
BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLES = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [UNK, BOS, EOS, PAD] + ROLES

# `<s><|user|>\nhi</s>\n<|assistant|>\n`: the template writes BOS itself, because vLLM
# tokenizes a rendered chat without adding special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

BASE_TEXT = """\
The quick brown fox jumps over the lazy dog. A key-value cache keeps the attention keys
and values of every token a model has already seen, so that the next token costs one
step instead of the whole prompt again. Blocks of 32 tokens are hashed from their parent
block and their own token ids; a router that knows which engine holds which blocks sends
a request where its prefix is already cached. Engines evict the least recently used
blocks when their cache is full, and publish every stored and removed block as an event.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 16 32 64 128 256 512 1024 2048 4096 65536.
Punctuation: , . ; : ! ? ' " ( ) [ ] { } < > / \\ | - _ + = * & ^ % $ # @ ~ `
"""

SYLLABLES = [
    c + v
    for c in ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t",
              "v", "w", "z", "ch", "sh", "th", "st", "tr", "pl"]
    for v in ["a", "e", "i", "o", "u", "ai", "ou", "er", "an", "in", "on"]
]


def corpus(rng):
    """The training text: the base text, then pseudo-words in pseudo-sentences."""
    yield BASE_TEXT
    for _ in range(4000):
        words = []
        for _ in range(rng.randint(6, 18)):
            word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))
            if rng.random() < 0.1:
                word = word.capitalize()
            if rng.random() < 0.05:
                word = str(rng.randint(0, 99999))
            words.append(word)
        yield " ".join(words) + rng.choice([".", ".", ".", ",", "?", "!", ";"]) + "\n"


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(random.Random(SEED)), trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"make_model: the tokenizer has {tokenizer.get_vocab_size()} ids, not {VOCAB_SIZE}")
    for expected, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == expected, token
    # BOS before every sequence when special tokens are asked for (vLLM asks for them on
    # /v1/completions text prompts); no EOS appended.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
    )
    return tokenizer


def write_tokenizer(out):
    tokenizer = train_tokenizer()
    tokenizer.save(os.path.join(out, "tokenizer.json"), pretty=True)
    added = {
        str(tokenizer.token_to_id(token)): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    }
    config = {
        "added_tokens_decoder": added,
        "additional_special_tokens": ROLES,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_MODEL_LEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
    }
    dump_json(os.path.join(out, "tokenizer_config.json"), config)
    dump_json(
        os.path.join(out, "special_tokens_map.json"),
        {
            "additional_special_tokens": ROLES,
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "unk_token": UNK,
        },
    )


def write_model(out):
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=SPECIAL_TOKENS.index(BOS),
        eos_token_id=SPECIAL_TOKENS.index(EOS),
        pad_token_id=SPECIAL_TOKENS.index(PAD),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    config.architectures = ["LlamaForCausalLM"]
    dump_json(os.path.join(out, "config.json"), json.loads(config.to_json_string()))
    generation = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    dump_json(
        os.path.join(out, "generation_config.json"), json.loads(generation.to_json_string())
    )
    tensors = {name: t.detach().contiguous() for name, t in sorted(model.state_dict().items())}
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def dump_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def digest(directory):
    """sha256 over the directory's file names and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        h.update(name.encode() + b"\0")
        with open(os.path.join(directory, name), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def write(out):
    os.makedirs(out, exist_ok=True)
    write_tokenizer(out)
    write_model(out)


def main(argv):
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[-1])
    out = argv[1]
    write(out)
    print(f"make_model: {out} sha256 {digest(out)}")
    if "--check" in argv[2:]:
        with tempfile.TemporaryDirectory() as again:
            write(again)
            if digest(again) != digest(out):
                sys.exit("make_model: a second run wrote different bytes")
        print("make_model: a second run wrote the same bytes")


if __name__ == "__main__":
    main(sys.argv)
