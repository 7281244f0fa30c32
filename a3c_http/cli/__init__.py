"""The commands `pip install .` gives (pyproject.toml, [project.scripts]), each a `main(argv)`
that returns the exit code:

    a3c-master    the master service (servers.py: uvicorn master.app:app)
    a3c-worker    a worker service (servers.py: uvicorn worker.app:app)
    a3c-train     a run on this host, or on a running master with --master URL (train.py)
    a3c-evaluate  play a run folder's weights (evaluate.py)
    a3c-plot      the reward plot of one run folder, or several compared (plot.py)
    a3c-export    a standalone policy from a run folder (a3c_http/policy/export.py)
    a3c-certs     a CA and hosts' certificates for the services' TLS (certs.py)
    a3c-hosts     the workers of a hosts file started, checked and stopped over ssh (hosts.py)

scripts/run_local.py, evaluate.py and plot_rewards.py call these from a checkout.
"""
