"""A handler for the Spark tests: fails the jobs whose data says so."""

from panqueue import Job, Registry

queues = Registry()


@queues.handler("spark-jobs", concurrency=20)
async def process(job: Job) -> int:
    if job.data.get("fail"):
        raise ValueError(f"row {job.data['n']} is bad")
    return int(job.data["n"])
