//! The console's browser tests' harness (docs/design.md §1.5, *The console in a browser*):
//! the running local stack as the environment names it, a headless Chromium driven through
//! chromedriver (fantoccini), bounded waits that poll until a deadline, and a screenshot of
//! every page a test visits.
//!
//! The tests (tests/console.rs) need a running stack: `scripts/e2e` brings one up, starts
//! chromedriver (scripts/browser.sh) and runs them with the environment below. Nothing here
//! measures time: a wait only bounds how long a test may take to see what it expects.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long a page may take to show what a test waits for.
pub const PAGE_WAIT: Duration = Duration::from_secs(20);
/// How long the worker may take to apply an event after a delivery or a replay.
pub const WORKER_WAIT: Duration = Duration::from_secs(60);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(250);
/// How many times [`Browser::page`] loads a page the emulator answered 500 itself.
const EMULATOR_LOADS: u32 = 3;

/// Polls `probe` until it returns `Some`, or fails after `deadline` saying `what` was not seen
/// (with the last error the probe gave, if any).
pub async fn wait_until<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match probe().await {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(e) => last_error = Some(format!("{e:#}")),
        }
        if start.elapsed() >= deadline {
            bail!(
                "{what}: not seen within {} s{}",
                deadline.as_secs(),
                last_error
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// What the tests need from the running stack, read from the environment that `scripts/e2e`
/// sets (`stack_env`, `stack_sources_env`).
#[derive(Clone, Debug)]
pub struct Stack {
    /// The console's root, ending in `/console/` (`$INBOX_INVOKE_URL/lambda-url/api/console/`).
    pub console_url: String,
    /// The api function's root: the console's URL without `console/`.
    pub api_url: String,
    pub admin_key: String,
    pub read_key: String,
    pub api_key: String,
    /// The intake, for `inboxctl send` (INTAKE_URL).
    pub intake_url: String,
    /// The stack's database: the tests read an event's status there, and one test stops a
    /// worker's attempt as a crash would leave it.
    pub database_url: String,
    /// chromedriver's URL (CHROMEDRIVER_URL).
    pub webdriver_url: String,
    /// Where each page's screenshot goes (CONSOLE_SCREENSHOTS).
    pub screenshots: PathBuf,
    /// The inboxctl binary (INBOXCTL, else the workspace's target/debug/inboxctl).
    pub inboxctl: PathBuf,
    /// The Chromium binary chromedriver starts (CHROMIUM_BIN, else /usr/bin/chromium).
    pub chromium: String,
}

fn var(name: &str) -> String {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => value,
        _ => panic!(
            "{name} is not set: the browser tests run against a running stack; run them with \
             scripts/e2e (or see docs/design.md §1.5 for the environment they need)"
        ),
    }
}

/// The workspace's root (this crate is tests/browser).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Stack {
    /// Reads the environment; panics naming the first variable that is missing.
    pub fn from_env() -> Self {
        let mut console_url = var("CONSOLE_URL");
        if !console_url.ends_with('/') {
            console_url.push('/');
        }
        let api_url = console_url
            .strip_suffix("console/")
            .unwrap_or_else(|| panic!("CONSOLE_URL must end in /console/, got {console_url}"))
            .trim_end_matches('/')
            .to_owned();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target"));
        Self {
            console_url,
            api_url,
            admin_key: var("INBOX_DEV_ADMIN_KEY"),
            read_key: var("INBOX_DEV_READ_KEY"),
            api_key: var("INBOX_DEV_API_KEY"),
            intake_url: var("INTAKE_URL"),
            database_url: var("DATABASE_URL"),
            webdriver_url: var("CHROMEDRIVER_URL"),
            screenshots: std::env::var_os("CONSOLE_SCREENSHOTS")
                .map(PathBuf::from)
                .unwrap_or_else(|| target.join("console-screenshots")),
            inboxctl: std::env::var_os("INBOXCTL")
                .map(PathBuf::from)
                .unwrap_or_else(|| target.join("debug/inboxctl")),
            chromium: std::env::var("CHROMIUM_BIN").unwrap_or_else(|_| "/usr/bin/chromium".into()),
        }
    }

    /// Runs `inboxctl --json <args>` against the stack (its environment is this process's:
    /// INTAKE_URL, INBOX_SOURCES, INBOX_PLANS, DATABASE_URL, the Kinde dev key) and parses
    /// what it prints; fails with its stderr when it exits non-zero.
    pub async fn inboxctl(&self, args: &[&str]) -> anyhow::Result<Value> {
        let output = tokio::process::Command::new(&self.inboxctl)
            .arg("--json")
            .args(args)
            .env("INTAKE_URL", &self.intake_url)
            .env("DATABASE_URL", &self.database_url)
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", self.inboxctl.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            bail!(
                "inboxctl {} failed ({}): {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                stdout.trim()
            );
        }
        serde_json::from_str(stdout.trim())
            .with_context(|| format!("inboxctl {}: not JSON: {stdout}", args.join(" ")))
    }

    /// Sends one signed delivery with `inboxctl send` and answers the stored event's id.
    pub async fn send(&self, args: &[&str]) -> anyhow::Result<i64> {
        let mut all = vec!["send"];
        all.extend_from_slice(args);
        let answer = self.inboxctl(&all).await?;
        answer["answers"][0]["body"]["event_id"]
            .as_i64()
            .ok_or_else(|| anyhow!("inboxctl send {}: no event id in {answer}", args.join(" ")))
    }

    pub async fn database(&self) -> anyhow::Result<sqlx::PgPool> {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(&self.database_url)
            .await
            .context("connecting to DATABASE_URL")
    }

    /// Waits until event `id` is in one of `statuses`, and answers the one it is in.
    pub async fn wait_event_status(
        &self,
        db: &sqlx::PgPool,
        id: i64,
        statuses: &[&str],
        deadline: Duration,
    ) -> anyhow::Result<String> {
        wait_until(
            &format!("event {id} {}", statuses.join(" or ")),
            deadline,
            || async {
                let status = event_status(db, id).await?;
                Ok(statuses.contains(&status.as_str()).then_some(status))
            },
        )
        .await
    }

    /// An HTTP request to the api function with `key`: its status and JSON body.
    pub async fn api(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{path}", self.api_url);
        let answer = reqwest::Client::new()
            .request(method.clone(), &url)
            .bearer_auth(key)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = answer.status().as_u16();
        let text = answer.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, body))
    }
}

/// An element not there (yet), or replaced since it was found: the console's script puts
/// each page's HTML in place when its answer comes, so a wait looks again.
fn gone(e: &fantoccini::error::CmdError) -> bool {
    e.is_no_such_element() || e.is_stale_element_reference()
}

/// Event `id`'s status in `inbox_events`.
pub async fn event_status(db: &sqlx::PgPool, id: i64) -> anyhow::Result<String> {
    sqlx::query_scalar("SELECT status FROM inbox_events WHERE id = $1")
        .bind(id)
        .fetch_one(db)
        .await
        .with_context(|| format!("reading event {id}"))
}

/// A customer id no other run of the tests has used.
pub fn fresh_customer(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}_{}_{nanos}", std::process::id())
}

/// One test's browser: a fresh headless Chromium (a profile of its own, removed at the end),
/// the pages it visits saved as `{test}-{nn}-{page}.png`.
pub struct Browser {
    pub stack: Stack,
    client: Client,
    test: &'static str,
    shots: usize,
    profile: PathBuf,
}

impl Browser {
    /// Starts a browser for `test` through chromedriver.
    pub async fn open(test: &'static str) -> anyhow::Result<Self> {
        let stack = Stack::from_env();
        std::fs::create_dir_all(&stack.screenshots)
            .with_context(|| format!("making {}", stack.screenshots.display()))?;
        let profile = std::env::temp_dir().join(fresh_customer(&format!("console-browser-{test}")));
        std::fs::create_dir_all(&profile)?;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1280,1000",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect::<Vec<_>>();
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({"binary": stack.chromium, "args": args}),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&stack.webdriver_url)
            .await
            .with_context(|| {
                format!(
                    "starting Chromium through chromedriver at {} (is it running? scripts/browser.sh start_chromedriver)",
                    stack.webdriver_url
                )
            })?;
        Ok(Self {
            stack,
            client,
            test,
            shots: 0,
            profile,
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Ends the test: on failure, a screenshot of where it stood and the page's text in the
    /// panic; the browser closed and its profile removed either way.
    pub async fn finish(mut self, outcome: anyhow::Result<()>) {
        let outcome = match outcome {
            Ok(()) => Ok(()),
            Err(e) => {
                let url = self
                    .client
                    .current_url()
                    .await
                    .map(|u| u.to_string())
                    .unwrap_or_else(|_| "?".into());
                let text = self.page_text().await;
                let failed = self.failed_loads().await;
                let shot = self.screenshot("failure").await;
                Err(anyhow!(
                    "{e:#}\n  at {url}\n  screenshot: {}\n  page text: {text}{}",
                    shot.map(|p| p.display().to_string())
                        .unwrap_or_else(|e| format!("none ({e:#})")),
                    if failed.is_empty() {
                        String::new()
                    } else {
                        format!("\n  loads that failed: {}", failed.join(", "))
                    }
                ))
            }
        };
        let _ = self.client.close().await;
        let _ = std::fs::remove_dir_all(&self.profile);
        if let Err(e) = outcome {
            panic!("{}: {e}", self.test);
        }
    }

    /// The console's page at `path` (relative to `/console/`, e.g. `events?status=dead`).
    pub async fn console(&self, path: &str) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.stack.console_url);
        self.client
            .goto(&url)
            .await
            .with_context(|| format!("opening {url}"))
    }

    /// Saves a screenshot of the whole window as `{test}-{nn}-{name}.png`.
    pub async fn screenshot(&mut self, name: &str) -> anyhow::Result<PathBuf> {
        self.shots += 1;
        let png = self
            .client
            .screenshot()
            .await
            .context("taking a screenshot")?;
        let path = self
            .stack
            .screenshots
            .join(format!("{}-{:02}-{name}.png", self.test, self.shots));
        std::fs::write(&path, png).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// The text of the page as a person reads it (the first 600 characters), for messages.
    pub async fn page_text(&self) -> String {
        let text = match self.client.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_default(),
            Err(e) => format!("(no body: {e})"),
        };
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        text.chars().take(600).collect()
    }

    /// What the page loaded (its script, its stylesheet, the fragments it fetched) that was
    /// answered 400 or more: `url status`, for a failure's message.
    pub async fn failed_loads(&self) -> Vec<String> {
        let answer = self
            .client
            .execute(
                "return performance.getEntriesByType('resource')
                   .filter(e => e.responseStatus >= 400)
                   .map(e => e.name + ' ' + e.responseStatus);",
                vec![],
            )
            .await;
        match answer {
            Ok(Value::Array(items)) => items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Waits until an element matches `css` and answers it.
    pub async fn find(&self, css: &str) -> anyhow::Result<fantoccini::elements::Element> {
        wait_until(&format!("an element {css}"), PAGE_WAIT, || async {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => Ok(Some(element)),
                Err(e) if gone(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Waits until the element `css` has text for which `accept` holds, and answers it.
    pub async fn text_where(
        &self,
        css: &str,
        what: &str,
        deadline: Duration,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let last = std::cell::RefCell::new(None);
        let (last_seen, accept) = (&last, &accept);
        let found = wait_until(&format!("{css} {what}"), deadline, || async move {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => {
                    let text = element.text().await?.trim().to_owned();
                    if accept(&text) {
                        return Ok(Some(text));
                    }
                    *last_seen.borrow_mut() = Some(text);
                    Ok(None)
                }
                Err(e) if gone(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await;
        found.map_err(|e| match last.into_inner() {
            Some(text) => e.context(format!("{css} said '{text}'")),
            None => e,
        })
    }

    /// Waits until the element `css` has an attribute `name`, and answers its value.
    pub async fn attr(&self, css: &str, name: &str, deadline: Duration) -> anyhow::Result<String> {
        wait_until(&format!("{css}[{name}]"), deadline, || async {
            match self.client.find(Locator::Css(css)).await {
                Ok(element) => Ok(element.attr(name).await?),
                Err(e) if gone(&e) => Ok(None),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Opens the console at `path` with no key in the tab, finds the key form (a field
    /// labelled "API key") and gives it `key`.
    pub async fn log_in(&self, path: &str, key: &str) -> anyhow::Result<()> {
        self.console(path).await?;
        let field = match self.find("#key-form input#api-key").await {
            Ok(field) => field,
            Err(error) => {
                // Under `cargo lambda watch` one of the page's assets is now and then answered
                // 500 although the api function answered it 200 (.dev/watch.log: the
                // function's response posted, then the request failed in the emulator); API
                // Gateway has no such step. The page is loaded once more then, said on
                // stderr; a second failure fails the test.
                let failed = self.failed_loads().await;
                if !failed.iter().any(|load| load.ends_with(" 500")) {
                    return Err(error.context("the console's key form"));
                }
                eprintln!("{}: loading the console again after {failed:?}", self.test);
                self.console(path).await?;
                self.find("#key-form input#api-key")
                    .await
                    .context("the console's key form, loaded a second time")?
            }
        };
        let label = self
            .text_where("label[for='api-key']", "labels the field", PAGE_WAIT, |t| {
                !t.is_empty()
            })
            .await?;
        if label != "API key" {
            bail!("the key field is labelled '{label}', not 'API key'");
        }
        field.send_keys(key).await.context("typing the key")?;
        self.find("#key-form button[type='submit']")
            .await?
            .click()
            .await
            .context("submitting the key form")?;
        // the key form goes once the script has the key and asks for the page
        wait_until("the key form to go", PAGE_WAIT, || async {
            match self.client.find(Locator::Css("#key-form")).await {
                Ok(_) => Ok(None),
                Err(e) if gone(&e) => Ok(Some(())),
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    /// Scrolls the element `css` to the middle of the window, so that its screenshot shows it.
    pub async fn scroll_to(&self, css: &str) -> anyhow::Result<()> {
        self.client
            .execute(
                "const e = document.querySelector(arguments[0]); if (e) { e.scrollIntoView({block: 'center'}); }",
                vec![json!(css)],
            )
            .await
            .with_context(|| format!("scrolling to {css}"))?;
        Ok(())
    }

    /// Sets the window's width (its height stays 1,000 pixels), for a page's look at that width.
    pub async fn width(&self, width: u32) -> anyhow::Result<()> {
        self.client
            .set_window_size(width, 1000)
            .await
            .with_context(|| format!("setting the window {width} pixels wide"))
    }

    /// Opens the console's page at `path` and waits until its fragment is in place
    /// (`#page[data-state='ready']`).
    ///
    /// A fragment answered 500 by `cargo lambda watch` itself (its own problem JSON, as
    /// `log_in` meets it for an asset) is loaded again, a second later, said on stderr, up to
    /// [`EMULATOR_LOADS`] loads in all: the emulator's 500s come in runs of two or three
    /// within a second on a loaded machine (three in a row once, the function answering
    /// each 200). A page that still fails fails the test.
    pub async fn page(&self, path: &str) -> anyhow::Result<()> {
        for attempt in 1..=EMULATOR_LOADS {
            self.console(path).await?;
            self.find("#page[data-state='ready'], #page[data-state='error']")
                .await
                .map_err(|e| e.context(format!("the page /console/{path}")))?;
            if self
                .client
                .find(Locator::Css("#page[data-state='ready']"))
                .await
                .is_ok()
            {
                return Ok(());
            }
            let failed = self.failed_loads().await;
            if attempt == EMULATOR_LOADS || !failed.iter().any(|load| load.ends_with(" 500")) {
                break;
            }
            eprintln!(
                "{}: loading /console/{path} again after {failed:?}",
                self.test
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        bail!(
            "the page /console/{path} answered an error: {}",
            self.page_text().await
        )
    }

    /// What the window cuts: each table wider than the box that holds it (its columns behind
    /// a scrollbar), and the page itself when it is wider than the window; by id or tag.
    pub async fn cut(&self) -> anyhow::Result<Vec<String>> {
        let cut = self
            .client
            .execute(
                "const cut = [...document.querySelectorAll('#page table')]
                   .filter(t => t.parentElement.clientWidth + 1 < t.scrollWidth)
                   .map(t => (t.id || 'table') + ' ' + t.scrollWidth + ' > ' + t.parentElement.clientWidth);
                 const page = document.documentElement;
                 if (page.scrollWidth > window.innerWidth + 1) {
                   cut.push('the page ' + page.scrollWidth + ' > ' + window.innerWidth);
                 }
                 return cut;",
                vec![],
            )
            .await?;
        Ok(cut
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The number of rows with cells (not the header's) in the table `css`.
    pub async fn rows(&self, css: &str) -> anyhow::Result<u64> {
        let count = self
            .client
            .execute(
                "const t = document.querySelector(arguments[0]);
                 return t ? [...t.querySelectorAll('tr')].filter(r => r.querySelector('td')).length : -1;",
                vec![json!(css)],
            )
            .await?;
        match count.as_i64() {
            Some(n) if n >= 0 => Ok(n as u64),
            _ => bail!("no table {css}"),
        }
    }

    /// How many elements `css` matches on the page now.
    pub async fn count(&self, css: &str) -> anyhow::Result<u64> {
        let count = self
            .client
            .execute(
                "return document.querySelectorAll(arguments[0]).length;",
                vec![json!(css)],
            )
            .await?;
        count
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no count of {css}"))
    }
}
