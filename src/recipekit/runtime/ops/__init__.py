"""The operations layer of one training process: the device found or refused, preflight, health and the hang
watchdog, the loss guard, metrics, profiling, recovery marks, and (testing only) injected faults.
"""
