"""Fixed prompt sets per class, the smoke prompts, and the long-context document.

The classes follow the published benchmark tables (coding, math, reasoning, prose,
natural language, extraction/JSON) plus a long-context class, because
speculative-decoding acceptance, and so throughput, depends on the class.
Prompts are fixed so that two soaks of the same host are comparable.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMPTS: dict[str, tuple[str, ...]] = {
    "coding": (
        "Write a Python function that returns the n-th Fibonacci number iteratively, with a "
        "docstring and type hints.",
        "Write a Python class implementing an LRU cache with get and put in O(1), using "
        "OrderedDict.",
        "Write a bash script that finds the ten largest files under a directory and prints their "
        "sizes.",
    ),
    "math": (
        "Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed in "
        "km/h?",
        "Compute the sum of the integers from 1 to 200, showing the formula you use.",
        "Find all real solutions of x^2 - 5x + 6 = 0 and verify each one.",
    ),
    "reasoning": (
        "Alice is older than Bob. Bob is older than Carol. Is Carol older than Alice? Explain your "
        "reasoning.",
        "A farmer has 17 sheep; all but 9 run away. How many are left? Explain the trick in the "
        "question.",
        "If every blorp is a snip and no snip is a glint, can a blorp be a glint? Reason it out.",
    ),
    "prose": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe a thunderstorm over the sea in vivid, poetic language.",
        "Write an evocative opening paragraph for a novel set in a city built on stilts.",
    ),
    "natural_language": (
        "Explain to a ten-year-old why the sky is blue.",
        "What are three good habits for getting better sleep? Answer conversationally.",
        "Summarise the causes of the French Revolution in a few sentences.",
    ),
    "extraction": (
        'Extract the fields as JSON {"name", "age", "city"} from: "Maria Lopez, 34, lives in '
        'Valencia."',
        'Return JSON with keys "product", "price", "currency" for: "The ACME drill costs 89.90 '
        'EUR."',
        'Convert to a JSON list of {"date", "event"}: "On 3 May we shipped v1; on 9 June, v2 went '
        'live."',
    ),
}

#: Question asked after the long document (its answer is in the document, so it can be drafted).
LONG_CONTEXT_QUESTION = (
    "\n\nWhich service logged the most ERROR lines above, and how many? Then list them."
)


@dataclass(frozen=True)
class SmokePrompt:
    """A prompt with a known answer: the reply must contain ``expect``."""

    name: str
    prompt: str
    expect: str


#: The operators' smoke test (docs/domain.md#health): greedy, the answer must contain 391.
SMOKE: tuple[SmokePrompt, ...] = (SmokePrompt("multiply", "What is 17 × 23?", "391"),)


#: Greedy canaries mixed into every load level: known answers (arithmetic, a fact, a copy
#: task), each also compared with the same prompt's answer at c=1. A server that corrupts
#: only under load, after hours, or in big batches answers these wrong while /health is 200.
CANARIES: tuple[SmokePrompt, ...] = (
    SmokePrompt("arithmetic", "What is 17 × 23?", "391"),
    SmokePrompt("fact", "What is the capital of France?", "Paris"),
    SmokePrompt(
        "copy", "Repeat exactly: amber falcon 7302 quiet river", "amber falcon 7302 quiet river"
    ),
)


#: What the long-decode probe asks the model to write at its natural end: found intact, it marks
#: where the model ended (loops past it are the model writing on under ignore_eos); garbled, it is
#: corruption deep in a sequence.
NEEDLE = "cobalt heron 4417"
NEEDLE_MARK = "THE END"
LONG_DECODE_PROMPT = (
    "Write a long, detailed technical history of lighthouses, chapter by chapter: their optics, "
    "their keepers, their automation, with dates and places. Take all the space you need. When you "
    f"have finished, end with the line: {NEEDLE_MARK} {NEEDLE}"
)


#: The long-prompt probes: a fact hidden in the middle of a long log, asked for at its end.
VAULT_CODE = "indigo kestrel 5821"
NEEDLE_QUESTION = "What is the vault code stated in the log above? Answer with the code only."


def needle_prompt(chars: int) -> str:
    """A log of about ``chars`` characters with the vault code stated in its middle, then the
    question."""
    doc = long_context_document(chars)
    mid = doc.find("\n", len(doc) // 2)
    mid = mid if mid >= 0 else len(doc)
    return (
        "Here is a service log:\n"
        + doc[:mid]
        + f"\nNOTE The vault code is {VAULT_CODE}."
        + doc[mid:]
        + "\n\n"
        + NEEDLE_QUESTION
    )


def long_context_document(chars: int) -> str:
    """A deterministic log-like document of about ``chars`` characters.

    Log lines are repetitive but not identical, like the agent histories the
    long-context acceptance figures were measured on.
    """
    services = ("api", "db", "cache", "auth", "queue", "billing")
    levels = ("INFO", "INFO", "WARN", "INFO", "ERROR", "INFO", "DEBUG")
    lines: list[str] = []
    total = 0
    i = 0
    while total < chars:
        svc = services[(i * 7) % len(services)]
        lvl = levels[(i * 3) % len(levels)]
        line = (
            f"2026-07-01T12:{(i // 60) % 60:02d}:{i % 60:02d}Z {lvl:<5} {svc:<7} "
            f"request id={i:06d} took {(i * 37) % 900 + 12} ms "
            f"status={200 if lvl != 'ERROR' else 500}"
        )
        lines.append(line)
        total += len(line) + 1
        i += 1
    return "\n".join(lines)


def prompt_for(cls: str, index: int, long_chars: int = 0) -> str:
    """The ``index``-th prompt of class ``cls`` (cycling); long_context builds its document."""
    if cls == "long_context":
        return (
            "Here is a service log:\n" + long_context_document(long_chars) + LONG_CONTEXT_QUESTION
        )
    prompts = PROMPTS[cls]
    return prompts[index % len(prompts)]


#: The classes mixed into the concurrency sweep and the sustained phase (long context has its own).
SHORT_CLASSES = tuple(PROMPTS)
