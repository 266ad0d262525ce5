"""The command line: argument parsing and rendering only.

This is the one place that prints, turns :class:`fleetctl.errors.FleetError`
into a message and an exit code, and plugs a display into the core's progress events.
"""
