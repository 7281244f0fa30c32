"""The Python API: train on a cluster of this host or on a running master, follow and end the
run, and play its policy without the services (docs/guide/python-api.md).

    import a3c_http

    run = a3c_http.train("CartPole-v1", config={"seed": 1})        # a master and 2 workers here
    print(run.solved, run.folder, len(run.history().episodes))
    policy = run.policy()                 # or a3c_http.load_policy("runs/CartPole-v1-...")
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    action, state = policy.act(obs)

- `train` (a3c_http/api/training.py) returns a `Run` (a3c_http/api/run.py), and `attach` the run
  a running master runs now; what a user can mend raises `TrainError`;
- `load_policy` (a3c_http/api/policy.py) returns a `Policy`;
- how `train`'s `env` becomes an env_id every host can make: a3c_http/api/environments.py.
"""

from a3c_http.api.errors import TrainError
from a3c_http.api.policy import Policy, load_policy
from a3c_http.api.run import History, Progress, Run
from a3c_http.api.training import attach, train

__all__ = ["History", "Policy", "Progress", "Run", "TrainError", "attach", "load_policy", "train"]
