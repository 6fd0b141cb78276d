"""One model over several processes of an mx.distributed group (docs/distributed.md): the plans
(split.py), the group's sessions and the followers (distributed.py), messages and failures
(link.py), starting a group from --hosts (launch.py, which imports nothing heavy: the CLI uses
it before any engine exists)."""
