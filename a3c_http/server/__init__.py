"""What both services' HTTP layer shares: the gate every request passes, the bounds on a request's
head and body, the interactive docs, the services' logs, and the performance hooks into uvicorn,
httpcore and glibc."""
