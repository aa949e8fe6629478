#!/usr/bin/env node
// Redis memory per waiting job for BullMQ, the figure scripts/bench.py --memory sets beside
// panqueue's (benchmarks/memory.py describes the measurement).
//
//   BULLMQ_PACKAGE_JSON=<dir with node_modules/bullmq>/package.json node memory_bullmq.js PORT N
//
// The server on 127.0.0.1:PORT must be a private one: this script FLUSHALLs it. One job on a
// warm-up queue first loads BullMQ's scripts and opens its connections, then the server is
// flushed and used_memory read; then N jobs of data {p: 'x' x 100} are added to queue 'memory'
// with Queue.addBulk, 1000 per call, and used_memory read again. Prints one line of JSON:
// {jobs, used_memory_before, used_memory_after, waiting, wait_key, events_key, sample_job_keys}
// (100 job keys spread evenly over the N, for the caller's MEMORY USAGE of a job hash).
'use strict';
const { createRequire } = require('module');

const BATCH = 1000;
const SAMPLES = 100;

if (!process.env.BULLMQ_PACKAGE_JSON || process.argv.length !== 4) {
  console.error('usage: BULLMQ_PACKAGE_JSON=<dir>/package.json node memory_bullmq.js PORT N');
  process.exit(2);
}
const req = createRequire(process.env.BULLMQ_PACKAGE_JSON);
const { Queue } = req('bullmq');
const IORedis = req('ioredis');

async function usedMemory(redis) {
  const info = await redis.info('memory');
  return parseInt(/used_memory:(\d+)/.exec(info)[1], 10);
}

function payload() {
  return { p: 'x'.repeat(100) };
}

async function main() {
  const port = parseInt(process.argv[2], 10);
  const n = parseInt(process.argv[3], 10);
  const connection = { host: '127.0.0.1', port };
  const redis = new IORedis(connection);

  // Script loading (EVAL caches each script body in the server) and connection buffers are
  // paid once per server, not per job: keep them out of the difference.
  const warmup = new Queue('memory-warmup', { connection });
  await warmup.add('job', payload());
  await warmup.close();
  await redis.flushall();

  const queue = new Queue('memory', { connection });
  await queue.waitUntilReady();
  const before = await usedMemory(redis);
  const every = Math.max(1, Math.floor(n / SAMPLES));
  const sampleJobKeys = [];
  for (let first = 0; first < n; first += BATCH) {
    const items = [];
    for (let i = first; i < Math.min(first + BATCH, n); i++) items.push({ name: 'job', data: payload() });
    const jobs = await queue.addBulk(items);
    jobs.forEach((job, k) => {
      if ((first + k) % every === 0) sampleJobKeys.push(queue.toKey(job.id));
    });
  }
  const after = await usedMemory(redis);
  const waiting = await queue.getWaitingCount();
  process.stdout.write(JSON.stringify({
    jobs: n,
    used_memory_before: before,
    used_memory_after: after,
    waiting,
    wait_key: queue.toKey('wait'),
    events_key: queue.toKey('events'),
    sample_job_keys: sampleJobKeys,
  }) + '\n');
  await queue.close();
  await redis.quit();
}

main().catch((err) => { console.error(err); process.exit(1); });
