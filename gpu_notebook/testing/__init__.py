"""Faithful fakes of what cannot run on a CPU laptop or in CI: NVML, cloud metadata services, cloud SDK clients.

Public and documented, as dask ships ``distributed.utils_test``: users can test their own monitoring or
preemption code against them. Each fake follows the real API's signatures and has its own tests against it.
"""
