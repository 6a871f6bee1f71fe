// The local SQS server (docs/design.md §1.5): local-aws-sqs on 127.0.0.1:<port>, in memory.
// Started by scripts/stack.sh (ensure_sqs); queues are recreated by it after a restart.
const { createSqsServer } = require("local-aws-sqs");

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
  console.error("usage: node serve.js <port>");
  process.exit(2);
}
createSqsServer({
  port,
  hostname: "127.0.0.1",
  accountId: "123456789012",
  // Tests create and delete many queues; AWS's 60 s wait before reusing a name is not wanted.
  emulateQueueCreationLifecycle: false,
}).then(
  () => console.log(`local-aws-sqs listening on 127.0.0.1:${port}`),
  (error) => {
    console.error(`local-aws-sqs could not start: ${error}`);
    process.exit(1);
  },
);
for (const signal of ["SIGTERM", "SIGINT"]) process.on(signal, () => process.exit(0));
