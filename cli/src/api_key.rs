//! `inboxctl api-key new`: a key for the app API, shown once, and the `INBOX_API_KEYS` entry
//! that lists it by its hash (docs/api.md).

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use shared::platform::api_keys::{self, KeyEntry, Scope};

#[derive(Args)]
pub struct ApiKeyArgs {
    #[command(subcommand)]
    command: ApiKeyCommand,
}

#[derive(Subcommand)]
enum ApiKeyCommand {
    /// Make a new key: print it once, with its entry for INBOX_API_KEYS (or the keys secret).
    New {
        /// The key's name, shown in the API's logs (e.g. the app's name).
        #[arg(long)]
        name: String,
        /// Comma-separated scopes: read (GET an account), usage (POST usage), replay (replay
        /// an account's own event), admin (the admin API and the console; never implied).
        #[arg(long, default_value = "read", value_delimiter = ',')]
        scopes: Vec<String>,
    },
}

pub fn run(args: &ApiKeyArgs, json_output: bool) -> anyhow::Result<()> {
    let ApiKeyCommand::New { name, scopes } = &args.command;
    if name.trim().is_empty() {
        anyhow::bail!("--name is empty");
    }
    let mut parsed = Vec::new();
    for scope in scopes {
        let scope = Scope::parse(scope.trim())
            .with_context(|| format!("unknown scope '{scope}' (read, usage, replay, admin)"))?;
        if !parsed.contains(&scope) {
            parsed.push(scope);
        }
    }
    let acts_on_an_account = parsed.contains(&Scope::Usage) || parsed.contains(&Scope::Replay);
    if acts_on_an_account && !parsed.contains(&Scope::Read) {
        // A debit answers with the account's usage, a replay names the account's event: both
        // read as well.
        parsed.insert(0, Scope::Read);
    }
    let key = api_keys::generate().context("reading the system's random source")?;
    let entry = KeyEntry {
        name: name.trim().to_owned(),
        sha256: api_keys::hash(&key),
        scopes: parsed,
    };
    let entry_json = serde_json::to_value(&entry)?;
    if json_output {
        out!("{}", json!({"key": key, "entry": entry_json}));
    } else {
        out!("key:   {key}");
        out!("entry: {entry_json}");
        out!("The key is shown only now: give it to the app. Add the entry to INBOX_API_KEYS");
        out!("(a JSON list) or to the list in the keys secret (ApiKeysSecretArn).");
    }
    Ok(())
}
