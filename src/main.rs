//! The `swarmtodo` command.

use std::path::PathBuf;

use anyhow::{Context, Result};
use automerge::ActorId;
use clap::{Parser, Subcommand};
use swarmtodo::authority::{Authority, Policy, Roles};
use swarmtodo::model::{TodoList, WriteContext};
use swarmtodo::proto::{PatchOp, Status, TaskPatch, WriteMode, WriteRequest};

#[derive(Debug, Parser)]
#[command(version, about = "Shared, live, typed todo state for agent swarms")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a lead and two subagents on one list in-process: concurrent writes, a
    /// violation, the authority's repair, and the converged list.
    Demo,
    /// Run the hub: automerge-repo sync over WebSocket, the authority in every merge,
    /// SQLite storage.
    Serve {
        /// Address to listen on (port 0: any free port; the bound address is printed).
        #[arg(long, env = "SWARMTODO_LISTEN", default_value = "127.0.0.1:7700")]
        listen: std::net::SocketAddr,
        /// SQLite file (created on first run).
        #[arg(long, env = "SWARMTODO_DATA", default_value = "swarmtodo.db")]
        data: PathBuf,
    },
    /// Write the JSON Schemas of the wire types into a folder.
    Schema {
        /// Target folder.
        #[arg(long, default_value = "proto/schema")]
        out: PathBuf,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo => demo(),
        Command::Serve { listen, data } => serve(listen, data),
        Command::Schema { out } => {
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            for (name, schema) in swarmtodo::proto::schemas() {
                let path = out.join(name);
                let text = serde_json::to_string_pretty(&schema)? + "\n";
                std::fs::write(&path, text)
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            Ok(())
        }
    }
}

fn serve(listen: std::net::SocketAddr, data: PathBuf) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWARMTODO_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let hub = swarmtodo::hub::Hub::open(&data)
            .await
            .with_context(|| format!("opening {}", data.display()))?;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        // Tests and scripts read this line to find the port.
        println!("swarmtodo listening on ws://{addr}");
        hub.serve(listener, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

fn upsert(id: &str, content: &str, status: Status, owner: &str) -> WriteRequest {
    WriteRequest {
        mode: WriteMode::Patch {
            ops: vec![PatchOp::Upsert {
                task: TaskPatch {
                    id: Some(id.into()),
                    content: Some(content.into()),
                    status: Some(status),
                    owner: Some(Some(owner.into())),
                    ..TaskPatch::default()
                },
            }],
        },
        expected_version: None,
        explanation: None,
    }
}

fn demo() -> Result<()> {
    let mut hub = TodoList::create(ActorId::from([0xA0; 16]));
    let mut authority = Authority::new("hub", Policy::default(), Roles::default());
    let mut lead = hub.fork(ActorId::from([0x01; 16]));
    let plan = WriteRequest {
        mode: WriteMode::Replace {
            tasks: [
                "Read the issue",
                "Write the parser",
                "Write the tests",
                "Run the tests",
            ]
            .iter()
            .enumerate()
            .map(|(i, c)| TaskPatch {
                id: Some(format!("t{}", i + 1)),
                content: Some((*c).into()),
                owner: Some(Some("worker".into())),
                ..TaskPatch::default()
            })
            .collect(),
            base_version: None,
        },
        expected_version: None,
        explanation: Some("initial plan".into()),
    };
    lead.write(&plan, &WriteContext::new("lead", 1_000, 1))
        .map_err(anyhow::Error::new)?;
    let merge = hub.merge_from(&lead)?;
    authority.process(&mut hub, merge, 1_001)?;

    // Two subagents, both acting for "worker", start different tasks at the same time.
    let mut a = hub.fork(ActorId::from([0x02; 16]));
    let mut b = hub.fork(ActorId::from([0x03; 16]));
    a.write(
        &upsert("t2", "Write the parser", Status::InProgress, "worker"),
        &WriteContext::new("sub-a", 2_000, 2),
    )
    .map_err(anyhow::Error::new)?;
    b.write(
        &upsert("t3", "Write the tests", Status::InProgress, "worker"),
        &WriteContext::new("sub-b", 2_000, 3),
    )
    .map_err(anyhow::Error::new)?;
    for replica in [&a, &b] {
        let merge = hub.merge_from(replica)?;
        let report = authority.process(&mut hub, merge, 2_001)?;
        for v in &report.violations {
            println!("violation: {}", serde_json::to_string_pretty(v)?);
        }
    }
    for replica in [&mut lead, &mut a, &mut b] {
        replica.merge_from(&hub)?;
    }
    println!("converged list (version {}):", hub.version());
    for t in hub.read().tasks {
        println!(
            "  [{:<11}] {:<3} {} ({})",
            t.status.as_str(),
            t.id,
            t.content,
            t.owner.unwrap_or_default()
        );
    }
    anyhow::ensure!(a.version() == hub.version() && b.version() == hub.version());
    Ok(())
}
