"""Where gradient pushes come in: POST /gradients served straight from ASGI, and the receiver
processes that take pushes on a port of their own and hand them to the master."""
