"""What the tests share beyond the harness (a3c_http/testing/): the services in-process and the
calls they make, clients and peers that misbehave on purpose, a headless browser, test environments,
log capture and schema checks. Each test layer (unit/, service/, cluster/, ops/) imports from here,
never from another test module."""
