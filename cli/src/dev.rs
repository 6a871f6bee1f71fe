//! `inboxctl dev`: the event source mapping and the schedule, for the local stack — and, when
//! given the command that serves the functions (`cargo lambda watch …`), its supervisor: a
//! function process that died (a panic, a kill) is never started again by `cargo lambda
//! watch`, so the pipeline would hang in silence. A function process seen running and then
//! gone (checked every second), invocations that time out, or failures in a row say so and
//! restart the functions; stopping `dev` stops every process the functions' command started.
//! `inboxctl dev sources` prints the local stack's sources.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use shared::dev::lambda_triggers;
use shared::providers::fixtures;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct DevArgs {
    #[command(subcommand)]
    pub command: Option<DevCommand>,
    /// Where `cargo lambda watch` serves the Lambda Invoke API.
    #[arg(
        long,
        env = "INBOX_INVOKE_URL",
        default_value = "http://127.0.0.1:61900"
    )]
    pub invoke_url: String,
    /// The queue the intake sends to (required to bridge; optional so that `dev sources`
    /// needs none).
    #[arg(long, env = "QUEUE_URL")]
    pub queue_url: Option<String>,
    /// The effects queue the worker sends to; when set, it is bridged to the dispatcher.
    #[arg(long, env = "EFFECTS_QUEUE_URL")]
    pub effects_queue_url: Option<String>,
    /// Seconds between scheduler runs (0: never).
    #[arg(long, default_value_t = 60)]
    pub tick_secs: u64,
    /// The shell command that serves the functions (e.g. `cargo lambda watch …`). When set,
    /// `dev` runs it and restarts it when a function stops answering.
    #[arg(long, env = "INBOX_FUNCTIONS_CMD")]
    pub functions_cmd: Option<String>,
    /// Where the functions' output goes (with --functions-cmd).
    #[arg(long, default_value = ".dev/watch.log")]
    pub functions_log: PathBuf,
    /// How long an invocation may take once the function has answered once (the first one
    /// may build it, and gets ten times as long).
    #[arg(long, env = "INBOX_INVOKE_TIMEOUT_SECS", default_value_t = 60)]
    pub invoke_timeout_secs: u64,
    /// Failed invocations in a row that count as a dead function.
    #[arg(long, default_value_t = 3)]
    pub failures_before_restart: u32,
}

#[derive(Subcommand)]
pub enum DevCommand {
    /// Print the local stack's INBOX_SOURCES: one development source per provider, as its
    /// fixtures configure it (dev-only secrets; Kinde verified with the local JWKS).
    Sources {
        /// Where the local JWKS serves the public half of the dev Kinde key.
        #[arg(long, default_value = "http://127.0.0.1:61325/jwks.json")]
        jwks_url: String,
        /// Point each source's provider API at `inboxctl fakes` on this first port (with a
        /// test-mode key the fake takes): thin-event reads, subscription reads, reconciliation,
        /// health sweeps and meter reports reach a provider API locally.
        #[arg(long)]
        fakes_port: Option<u16>,
    },
}

/// The function binaries `cargo lambda watch` runs, by program name.
const FUNCTION_NAMES: [&str; 6] = [
    "intake",
    "worker",
    "scheduler",
    "dispatcher",
    "api",
    "bridge",
];

/// The functions' process, when `dev` runs it.
struct Functions {
    command: Option<String>,
    log: PathBuf,
    child: Mutex<Option<Child>>,
    /// The function processes seen running since the last (re)start, and for how many checks
    /// in a row each has been missing.
    seen: Mutex<HashMap<String, u32>>,
    /// How many times the functions were restarted (counted as the restart begins).
    restarts: std::sync::atomic::AtomicU64,
}

impl Functions {
    fn new(command: Option<String>, log: PathBuf) -> Self {
        Self {
            command,
            log,
            child: Mutex::new(None),
            seen: Mutex::new(HashMap::new()),
            restarts: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Changes as each restart of the functions begins.
    fn generation(&self) -> u64 {
        self.restarts.load(std::sync::atomic::Ordering::SeqCst)
    }

    async fn start(&self) -> anyhow::Result<()> {
        let Some(command) = &self.command else {
            return Ok(());
        };
        if let Some(dir) = self.log.parent() {
            std::fs::create_dir_all(dir).ok();
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        // Its own process group, so that stopping it stops the function processes it runs.
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the functions: {command}"))?;
        *self.child.lock().await = Some(child);
        Ok(())
    }

    /// Stops the functions' process group, if `dev` runs it, and every process under it:
    /// `cargo lambda watch` starts each function in a session of its own, which a signal to
    /// the group does not reach, and a function left behind polls its dead runtime API (an
    /// error a second in its log) until someone kills it.
    async fn stop(&self) {
        self.seen.lock().await.clear();
        let Some(mut child) = self.child.lock().await.take() else {
            return;
        };
        // Found by parent before the group goes: once it has, they have none to be found by.
        let under = child.id().map(descendants).unwrap_or_default();
        if let Some(args) = child.id().and_then(kill_group_args) {
            let _ = Command::new("kill").args(&args).status().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
        let _ = child.kill().await;
        end_processes(&under).await;
    }

    /// Stops the functions (and every process they started) and starts them again.
    async fn restart(&self, why: &str) -> anyhow::Result<()> {
        if self.command.is_none() {
            eprintln!(
                "dev: {why}; restart the functions (scripts/dev does it for you with --functions-cmd)"
            );
            return Ok(());
        }
        eprintln!("dev: {why}; restarting the functions");
        self.restarts
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.stop().await;
        self.start().await
    }

    /// Whether the functions' process has exited by itself.
    async fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.lock().await;
        child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// A function whose process was seen running and has been gone for two checks in a row
    /// (one check may fall between a rebuild's stop and start of it), if any.
    async fn gone(&self) -> Option<String> {
        let pid = self.child.lock().await.as_ref().and_then(Child::id)?;
        let running = running_functions(pid);
        let mut seen = self.seen.lock().await;
        for name in &running {
            seen.insert(name.clone(), 0);
        }
        let mut gone = None;
        for (name, missing) in seen.iter_mut() {
            if !running.contains(name) {
                *missing += 1;
                if *missing >= 2 {
                    gone = Some(name.clone());
                }
            }
        }
        gone
    }
}

/// The functions running under `root`, by program name (the file name of each process's
/// `argv[0]`: `target/debug/worker` is `worker`).
fn running_functions(root: u32) -> HashSet<String> {
    descendants(root)
        .into_iter()
        .filter_map(program_of)
        .filter(|name| FUNCTION_NAMES.contains(&name.as_str()))
        .collect()
}

/// The live processes under `root` (its children, theirs, …), found by parent in /proc.
fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Some((parent, _)) = stat_of(pid) {
            children.entry(parent).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            found.push(child);
            next.push(child);
        }
    }
    found.retain(|pid| alive(*pid));
    found
}

/// A process's parent and state, from /proc/<pid>/stat: the fields after the command name,
/// which is in parentheses and may hold spaces and parentheses itself.
fn stat_of(pid: u32) -> Option<(u32, char)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    Some((parent, state))
}

/// Whether a process exists and has not exited (a zombie has, and waits to be reaped).
fn alive(pid: u32) -> bool {
    stat_of(pid).is_some_and(|(_, state)| !matches!(state, 'Z' | 'X' | 'x'))
}

/// The file name of a process's `argv[0]`.
fn program_of(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv0 = cmdline.split(|b| *b == 0).next()?;
    let path = std::str::from_utf8(argv0).ok()?;
    Some(path.rsplit('/').next()?.to_owned())
}

/// Ends `pids` (TERM, then KILL after 5 s for what is left); none of them 0 or 1.
async fn end_processes(pids: &[u32]) {
    for signal in ["TERM", "KILL"] {
        let left: Vec<String> = pids
            .iter()
            .filter(|pid| **pid > 1 && alive(**pid))
            .map(u32::to_string)
            .collect();
        if left.is_empty() {
            return;
        }
        let _ = Command::new("kill")
            .args(["-s", signal, "--"])
            .args(&left)
            .status()
            .await;
        for _ in 0..50 {
            if !pids.iter().any(|pid| alive(*pid)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The `kill` arguments that end the process group `pgid` and nothing else. The group's id is
/// the child's pid; `kill -TERM -<n>` without `--` can be read as a signal to every process,
/// and 0 or 1 would name the caller's group or every process: none for those.
fn kill_group_args(pgid: u32) -> Option<[String; 4]> {
    (pgid > 1).then(|| {
        [
            "-s".to_owned(),
            "TERM".to_owned(),
            "--".to_owned(),
            format!("-{pgid}"),
        ]
    })
}

/// Why the functions need a restart after a failed invocation, if they do. A function answers
/// in milliseconds: a timeout means its process is gone; other failures count in a row.
fn restart_reason(function: &str, timed_out: bool, in_a_row: u32, limit: u32) -> Option<String> {
    if timed_out {
        Some(format!("{function} stopped answering"))
    } else if in_a_row >= limit {
        Some(format!("{function} failed {in_a_row} times in a row"))
    } else {
        None
    }
}

/// Invokes the functions, tracking whether each answers.
struct Invoker<'a> {
    http: reqwest::Client,
    args: &'a DevArgs,
    functions: &'a Functions,
    /// Failed invocations in a row, per function.
    failures: Mutex<HashMap<String, u32>>,
    /// The functions that have answered since the last (re)start.
    warm: Mutex<HashSet<String>>,
}

impl Invoker<'_> {
    /// Invokes `function`; when the functions were restarted while the call was out (it
    /// failed with them: a function process that died, a timeout), the same event goes to
    /// the new process once it answers, so that a message in flight is not left to wait out
    /// its visibility timeout (minutes) for a restart that took seconds.
    async fn invoke(
        &self,
        function: &str,
        payload: &impl serde::Serialize,
    ) -> anyhow::Result<Value> {
        let generation = self.functions.generation();
        match self.call(function, payload).await {
            Err(e) if self.functions.generation() != generation => {
                eprintln!("dev: {function} again, after the restart (the last call failed with it: {e:#})");
                wait_until_up(self.functions, &self.args.invoke_url).await?;
                self.call(function, payload).await
            }
            answered => answered,
        }
    }

    /// One invocation: a function that has answered once gets the short timeout; failures
    /// in a row past the limit, or a timeout, restart the functions.
    async fn call(&self, function: &str, payload: &impl serde::Serialize) -> anyhow::Result<Value> {
        let warm = self.warm.lock().await.contains(function);
        let limit = Duration::from_secs(if warm {
            self.args.invoke_timeout_secs
        } else {
            self.args.invoke_timeout_secs * 10
        });
        let call =
            lambda_triggers::invoke_function(&self.http, &self.args.invoke_url, function, payload);
        let (result, timed_out) = match tokio::time::timeout(limit, call).await {
            Ok(result) => (result, false),
            Err(_) => (
                Err(anyhow::anyhow!(
                    "{function} did not answer within {} s",
                    limit.as_secs()
                )),
                true,
            ),
        };
        let mut failures = self.failures.lock().await;
        let in_a_row = failures.entry(function.to_owned()).or_default();
        match &result {
            Ok(_) => {
                *in_a_row = 0;
                self.warm.lock().await.insert(function.to_owned());
            }
            Err(e) => {
                *in_a_row += 1;
                eprintln!("dev: {e:#}");
                let why = restart_reason(
                    function,
                    timed_out,
                    *in_a_row,
                    self.args.failures_before_restart,
                );
                if let Some(why) = why {
                    failures.clear();
                    self.warm.lock().await.clear();
                    self.functions.restart(&why).await?;
                }
            }
        }
        result
    }
}

/// Waits until the functions' Invoke API listens (the first start builds them). A connection
/// is all it asks for: a request of its own would be an error in the functions' log (no such
/// route), the first line a person reads there.
async fn wait_until_up(functions: &Functions, invoke_url: &str) -> anyhow::Result<()> {
    let url = reqwest::Url::parse(invoke_url).with_context(|| format!("the URL {invoke_url}"))?;
    let address = format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port_or_known_default().unwrap_or(80)
    );
    for _ in 0..1200 {
        let connect = tokio::net::TcpStream::connect(&address);
        if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), connect).await {
            eprintln!("dev: the functions answer at {invoke_url}");
            return Ok(());
        }
        if let Some(status) = functions.exited().await {
            anyhow::bail!(
                "the functions did not start ({status}); see {}",
                functions.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::bail!("the functions did not answer at {invoke_url} within 10 minutes")
}

pub async fn run(args: &DevArgs) -> anyhow::Result<()> {
    if let Some(DevCommand::Sources {
        jwks_url,
        fakes_port,
    }) = &args.command
    {
        let local = fixtures::Local { jwks_url };
        let mut sources = fixtures::dev_sources(&local);
        if let Some(port) = fakes_port {
            crate::fakes::point_at(&mut sources, *port);
        }
        out!("{sources}");
        return Ok(());
    }
    let queue_url = args
        .queue_url
        .as_deref()
        .context("QUEUE_URL is not set (or pass --queue-url)")?;
    // Long polls outlast the short timeouts the functions use.
    let sqs = aws_sdk_sqs::Client::from_conf(
        aws_sdk_sqs::config::Builder::from(&shared::platform::queue::sdk_config().await)
            .timeout_config(
                aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(2))
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .operation_timeout(Duration::from_secs(60))
                    .build(),
            )
            .build(),
    );
    let functions = Functions::new(args.functions_cmd.clone(), args.functions_log.clone());
    functions.start().await?;
    if functions.command.is_some() {
        wait_until_up(&functions, &args.invoke_url).await?;
    }
    let invoker = Invoker {
        http: reqwest::Client::new(),
        args,
        functions: &functions,
        failures: Mutex::new(HashMap::new()),
        warm: Mutex::new(HashSet::new()),
    };
    eprintln!(
        "dev: bridging {} -> worker at {}; scheduler every {} s (Ctrl-C stops)",
        queue_url, args.invoke_url, args.tick_secs
    );
    if let Some(effects) = &args.effects_queue_url {
        eprintln!("dev: bridging {effects} -> dispatcher");
    }
    let bridge = bridge_loop(&sqs, queue_url, "worker", &invoker);
    let effects_bridge = async {
        match &args.effects_queue_url {
            Some(url) => bridge_loop(&sqs, url, "dispatcher", &invoker).await,
            None => std::future::pending().await,
        }
    };
    let ticker = async {
        if args.tick_secs == 0 {
            return std::future::pending().await;
        }
        let mut interval = tokio::time::interval(Duration::from_secs(args.tick_secs));
        loop {
            interval.tick().await;
            match invoker
                .invoke("scheduler", &lambda_triggers::scheduled_event())
                .await
            {
                Ok(report) => eprintln!(
                    "scheduler: rescued {}, purged {}, audited {}, divergent {}, errors {}",
                    report["rescued"].as_array().map_or(0, Vec::len),
                    report["purged"],
                    report["audited"],
                    report["divergent"],
                    report["errors"].as_array().map_or(0, Vec::len)
                ),
                Err(e) => eprintln!("scheduler: {e:#}"),
            }
        }
    };
    // A function process that died is restarted within seconds, before an invocation waits
    // for it; the functions' own process may end too (a crash of `cargo lambda watch`).
    let watchdog = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let why = match functions.exited().await {
                Some(status) => Some(format!("the functions' process exited ({status})")),
                None => functions
                    .gone()
                    .await
                    .map(|name| format!("the {name} function's process is gone")),
            };
            if let Some(why) = why {
                invoker.failures.lock().await.clear();
                invoker.warm.lock().await.clear();
                functions.restart(&why).await?;
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), anyhow::Error>(())
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    let outcome = tokio::select! {
        _ = bridge => Ok(()),
        _ = effects_bridge => Ok(()),
        _ = ticker => Ok(()),
        stopped = watchdog => stopped,
        _ = terminate.recv() => {
            eprintln!("dev: stopped");
            Ok(())
        }
        signal = tokio::signal::ctrl_c() => {
            signal.context("waiting for Ctrl-C")?;
            eprintln!("dev: stopped");
            Ok(())
        }
    };
    functions.stop().await;
    outcome
}

/// Plays one SQS event source mapping for ever: receives from `queue_url` and invokes
/// `function` with each batch; what it reports as failed stays for redelivery. The local SQS
/// server answers a long poll only once it holds a whole batch (10) or the wait is over, so a
/// lone event would wait out the poll (10 s) before the function saw it; the bridge receives
/// without waiting instead (the server answers in about 40 ms when it has fewer than 10), and
/// rests 100 ms after a receive that found nothing.
async fn bridge_loop(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    function: &str,
    invoker: &Invoker<'_>,
) {
    loop {
        let invoke = |event| async move {
            let value = invoker.invoke(function, &event).await?;
            serde_json::from_value(value)
                .with_context(|| format!("reading the {function}'s SqsBatchResponse"))
        };
        match lambda_triggers::pump_once(sqs, queue_url, 0, invoke).await {
            Ok(r) if r.received > 0 => {
                eprintln!(
                    "bridge: {} message(s) -> {function}, {} done, {} left for redelivery",
                    r.received, r.deleted, r.failed
                )
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => {
                eprintln!("bridge ({function}): {e:#}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_functions_group_is_signalled() {
        assert_eq!(
            kill_group_args(4242).unwrap(),
            ["-s", "TERM", "--", "-4242"].map(String::from)
        );
        // 0 is the caller's own group and -1 every process: never signalled.
        assert_eq!(kill_group_args(0), None);
        assert_eq!(kill_group_args(1), None);
    }

    /// A scratch directory of this test's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("inboxctl-dev-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Functions whose command starts, in a session of its own (as `cargo lambda watch` starts
    /// each function), a process named `target/debug/worker` that writes its pid to a file;
    /// started, with that pid and the scratch directory.
    async fn a_worker_in_its_own_session(name: &str) -> (Functions, u32, PathBuf) {
        let dir = scratch(name);
        let pidfile = dir.join("worker.pid");
        let command = format!(
            "sh -c 'setsid bash -c \"echo \\$\\$ > {}; exec -a /x/target/debug/worker sleep 300\" & wait'",
            pidfile.display()
        );
        let functions = Functions::new(Some(command), dir.join("functions.log"));
        functions.start().await.unwrap();
        for _ in 0..100 {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                return (functions, pid, dir);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the worker wrote no pid to {}", pidfile.display());
    }

    #[tokio::test]
    async fn stopping_the_functions_ends_the_processes_they_started_in_sessions_of_their_own() {
        let (functions, worker, dir) = a_worker_in_its_own_session("stop").await;
        assert!(alive(worker));

        functions.stop().await;

        assert!(!alive(worker), "the worker in its own session is ended too");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn a_function_process_seen_running_and_then_gone_is_noticed_at_the_second_check() {
        let (functions, worker, dir) = a_worker_in_its_own_session("gone").await;
        assert_eq!(functions.gone().await, None, "running");
        assert_eq!(program_of(worker).as_deref(), Some("worker"));

        end_processes(&[worker]).await;

        assert_eq!(
            functions.gone().await,
            None,
            "one check may fall in a rebuild"
        );
        assert_eq!(functions.gone().await.as_deref(), Some("worker"));
        functions.stop().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn waiting_for_the_functions_sends_them_no_request() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let functions = Functions::new(None, PathBuf::from("functions.log"));

        let (up, accepted) = tokio::join!(wait_until_up(&functions, &url), listener.accept());

        up.unwrap();
        let (mut stream, _) = accepted.unwrap();
        let mut sent = Vec::new();
        stream.read_to_end(&mut sent).await.unwrap();
        assert!(sent.is_empty(), "{}", String::from_utf8_lossy(&sent));
    }

    #[test]
    fn a_timeout_restarts_at_once_other_failures_after_the_limit() {
        assert_eq!(
            restart_reason("worker", true, 1, 3).as_deref(),
            Some("worker stopped answering")
        );
        assert_eq!(restart_reason("worker", false, 2, 3), None);
        assert_eq!(
            restart_reason("scheduler", false, 3, 3).as_deref(),
            Some("scheduler failed 3 times in a row")
        );
    }
}
