"""Parameter-server shards (Gorila's): processes that each own a slice of the global network's
parameters and of its optimizer's state, so that decoding, stepping and encoding a push's
gradients run on as many cores as there are shards (config `shards`, an A3C run's).

A push crosses them in three steps, each shard's in parallel (a3c_http/net/shards.py, the
worker's side):

1. **stage** (`POST /shard/stage`, to every shard): the shard decodes and checks its slice of the
   gradients, keeps it, and answers with its slice's sum of squares and a receipt, signed with a
   key the master gave it for this run (shard.py);
2. **commit** (`POST /shards/commit`, to the master, a small JSON body): the master checks that
   every shard's receipt is there and genuine, and admits the push as it admits any gradient push
   (the run, the worker, the request number, staleness, the outlier check on the norm the shards'
   sums make, the rollout's report counted). Admitted, it gets the next version, a ticket, which
   the master hands to every shard in order (coordinator.py); refused, no shard applies it;
3. **fetch** (`GET /shard/weights?version=V`, from every shard): each shard answers once it has
   applied the push's ticket, with its slice of the weights; the worker joins them.

So a push is applied by every shard or by none, every shard applies the same pushes in the same
order and the versions of all shards are the master's. The run folder stays the master's: a save
first gathers every shard's slice and optimizer state at one version (the master holds its
tickets while it does), and a master that opens the folder again hands the shards their slices
from it. A shard that fails or is killed stops the run's pushes (503, naming it) until the master
has started it again and put every shard back to the last version it gathered, so that no shard
is ever ahead of another; what was applied since is lost, as after a master's crash (at most
the save interval).
"""
