"""The names the HTTP contract (docs/http-api.md) gives to headers and media types, in one place:
the client, the master and the worker import them from here, so a name cannot drift between the
two sides.
"""

from __future__ import annotations

# The default of A3C_MAX_BODY_BYTES: the largest request body a service reads, and the largest reply
# a worker reads from its master.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# A worker's id, and the name a worker that joins gives itself: what a header, a log line and a
# URL's query carry as they are.
WORKER_ID_PATTERN = r"^[A-Za-z0-9._:@/-]+$"
# Tensors (weights and gradients) travel as one safetensors file in the body.
CONTENT_TYPE = "application/octet-stream"

# The version of the global weights a weights body holds, or that gradients were computed on.
VERSION_HEADER = "X-Model-Version"
# Which worker sends gradients, and for which run.
WORKER_ID_HEADER = "X-Worker-Id"
RUN_ID_HEADER = "X-Run-Id"
# A worker's rising request number; its retries keep it, so the master never counts one twice.
SEQ_HEADER = "X-A3C-Seq"
# A request number is 1 to this (a worker's window of numbers taken keeps the highest: one past
# any honest count would make every later number look like a retry).
MAX_SEQ = 2**62
# "1" on a reply: the master has already taken this request (a retry), nothing was counted again.
DUPLICATE_HEADER = "X-A3C-Duplicate"
# "1" on a reply: the run is over, the worker should stop.
STOP_HEADER = "X-A3C-Stop"
# Optional on a gradient push: the rollout's total loss and the gradients' global L2 norm before
# clipping, which the master judges against the recent updates (refusing outliers).
LOSS_HEADER = "X-A3C-Loss"
GRAD_NORM_HEADER = "X-A3C-Grad-Norm"
# The entry of a gradient body's safetensors metadata that carries the rollout's finished episodes
# and the worker's statistics (JSON: {"episodes": [[return, length], ...], "stats": {...}}).
ROLLOUT_METADATA = "a3c"
# How long the master may hold an experience push's reply while the learner's queue is full (then
# 503): a client waits this long beyond its usual timeout.
EXPERIENCE_HOLD_S = 60.0
# On a gradient push's reply: the run's summary, as POST /episode answers them (best score and
# moving average are left out while there are none).
GLOBAL_EPISODE_HEADER = "X-A3C-Global-Episode"
BEST_SCORE_HEADER = "X-A3C-Best-Score"
MOVING_AVERAGE_HEADER = "X-A3C-Moving-Average"
IMPROVED_HEADER = "X-A3C-Improved"
# The largest integer SQLite stores (a signed 64-bit one): a paging number or a version past it
# names no row, and handing it to SQLite would overflow.
MAX_SQLITE_INT = 2**63 - 1
# The largest count a worker may report (episodes, steps): the largest integer a float64 holds
# exactly, as Prometheus and the dashboard's JavaScript read them, and far inside SQLite's.
MAX_COUNT = 2**53
# An episode's return, a step's reward and an n-step return lie within +-MAX_ABS_RETURN: it keeps
# every sum and mean of returns finite, and a critic's squared TD error of one such reward too.
MAX_ABS_RETURN = 1e9
# GET /metrics: Prometheus's text exposition format.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Parameter-server shards (master/shards/): a push's three steps. The worker stages its slice of
# the gradients on every shard, commits the push to the master with the shards' receipts, and
# fetches each shard's slice of the weights once the push's version is applied there.
SHARD_STAGE_PATH = "/shard/stage"
SHARD_WEIGHTS_PATH = "/shard/weights"
SHARDS_PATH = "/shards"  # the master's: the run's shards (GET), a push's commit (POST .../commit)
SHARD_EPOCH_HEADER = "X-A3C-Shard-Epoch"  # the shards' current opening (a reset starts another)
