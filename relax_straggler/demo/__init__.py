"""A small, real training workload shared by the demo, the parity check and the benchmarks:
a character-level GPT, a corpus every machine has, ways to make one rank slow, and the
training as a loss-parity factory (`demo_factory`)."""

from relax_straggler.demo.data import Batches, load_corpus
from relax_straggler.demo.faults import Contender, inject_delays, parse_delays, parse_jitter
from relax_straggler.demo.gpt import GPT, GPTConfig, next_token_loss, train_step
from relax_straggler.demo.training import DemoSpec, demo_factory

__all__ = ["GPT", "GPTConfig", "Batches", "Contender", "DemoSpec", "demo_factory", "inject_delays", "load_corpus",
           "next_token_loss", "parse_delays", "parse_jitter", "train_step"]
