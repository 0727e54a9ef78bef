//! `swarmtodo mcp`: an MCP server on stdio that acts as one agent on one list of one hub,
//! through the hub's JSON API. Tools: swarmtodo's own (`todo_read`, `todo_write`,
//! `todo_claim`) and ones shaped like the todo tools models know, taking exactly their
//! payloads ([`shapes`]); the list and its latest violations as resources a client can
//! subscribe to (`notifications/resources/updated` when they change).
//!
//! The server speaks the MCP revisions with an `initialize` handshake (up to
//! 2025-11-25), which every MCP client of the coding agents speaks.

mod agent;
pub mod shapes;
mod tools;

use std::borrow::Cow;
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};

use self::agent::{lock, Agent};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ResourceUpdatedNotificationParam,
    ServerCapabilities, ServerConfig, SubscribeRequestParams, UnsubscribeRequestParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};

use crate::client::http::{Api, StreamItem};
use crate::proto::EventBody;

/// Violations, conflicts and repairs the violations resource shows (the latest).
pub const RECENT_VIOLATIONS_MAX: usize = 50;
/// The first wait before the event follower tries the hub again (the hub gone, the
/// list not made yet); it doubles up to [`FOLLOW_RETRY_MAX`], and starts over once
/// the stream brings something.
pub const FOLLOW_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest wait between the event follower's tries.
pub const FOLLOW_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// What `swarmtodo mcp` is given.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// The hub's API.
    pub api: Api,
    /// The list this agent works on.
    pub list: String,
    /// The agent's name (for the tool texts; the hub knows it from the token or header).
    pub agent: String,
}

/// The MCP server of one agent.
#[derive(Debug, Clone)]
pub struct Server {
    agent: Arc<Agent>,
}

impl Server {
    /// The server for `options` (nothing is called before the client calls).
    pub fn new(options: McpOptions) -> Server {
        Server {
            agent: Arc::new(Agent {
                api: options.api,
                list: options.list,
                agent: options.agent,
                last: Mutex::new(None),
                created: Mutex::new(BTreeSet::new()),
                subscribed: Mutex::new(BTreeSet::new()),
                recent: Mutex::new(VecDeque::new()),
                peer: Mutex::new(None),
                found: tokio::sync::Notify::new(),
            }),
        }
    }

    fn remember_peer(&self, context: &RequestContext<RoleServer>) {
        let mut peer = lock(&self.agent.peer);
        if peer.is_none() {
            *peer = Some(context.peer.clone());
        }
    }
}

/// Runs the server on stdin and stdout until the client closes them.
pub async fn serve(options: McpOptions) -> anyhow::Result<()> {
    let server = Server::new(options);
    tokio::spawn(follow(server.agent.clone()));
    let running = server.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

/// Follows the list's events (from the first, reconnecting after the last one seen):
/// keeps the latest violations, and tells the client when a resource it subscribed to
/// changed.
async fn follow(agent: Arc<Agent>) {
    let mut from = 0;
    let mut retry = FOLLOW_RETRY_MIN;
    loop {
        let mut came = false;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<String>>();
        let list_uri = agent.list_uri();
        let violations_uri = agent.violations_uri();
        let notify = {
            let agent = agent.clone();
            tokio::spawn(async move {
                while let Some(uris) = rx.recv().await {
                    let peer = lock(&agent.peer).clone();
                    let Some(peer) = peer else { continue };
                    for uri in uris {
                        if lock(&agent.subscribed).contains(&uri) {
                            let _ = peer
                                .notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                                .await;
                        }
                    }
                }
            })
        };
        let result = agent
            .api
            .events(&agent.list, from, None, |item| {
                came = true;
                let StreamItem::Event(event) = item else {
                    return true;
                };
                from = event.seq;
                let mut uris = Vec::new();
                match &event.body {
                    EventBody::Violation(_)
                    | EventBody::Conflict(_)
                    | EventBody::Repaired { .. } => {
                        let mut recent = lock(&agent.recent);
                        if let Ok(v) = serde_json::to_value(&*event) {
                            recent.push_back(v);
                        }
                        while recent.len() > RECENT_VIOLATIONS_MAX {
                            recent.pop_front();
                        }
                        uris.push(violations_uri.clone());
                    }
                    EventBody::TasksChanged { .. } => uris.push(list_uri.clone()),
                    _ => {}
                }
                if !uris.is_empty() {
                    let _ = tx.send(uris);
                }
                true
            })
            .await;
        if let Err(e) = result {
            tracing::debug!(list = %agent.list, error = %e, "the event stream ended");
        }
        notify.abort();
        // The hub went away or the list is not there yet: try again, later each time
        // nothing came.
        retry = if came {
            FOLLOW_RETRY_MIN
        } else {
            (retry * 2).min(FOLLOW_RETRY_MAX)
        };
        tokio::select! {
            () = tokio::time::sleep(retry) => {}
            () = agent.found.notified() => {}
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_tools()
            .enable_resources()
            .enable_resources_subscribe()
            .build();
        let mut info = ServerConfig::new(capabilities).with_instructions(tools::INSTRUCTIONS);
        info.protocol_version = ProtocolVersion::V_2025_11_25;
        info.server_info.name = "swarmtodo".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        self.remember_peer(&context);
        Ok(ListToolsResult::with_all_items(tools::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        self.remember_peer(&context);
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let result = tools::call(&self.agent, &request.name, arguments).await?;
        Ok(result.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        self.remember_peer(&context);
        let list = &self.agent.list;
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(self.agent.list_uri(), format!("list {list}"))
                .with_description(
                    "The shared list: its version and its tasks in order (JSON, a swarmtodo snapshot).",
                )
                .with_mime_type("application/json"),
            Resource::new(self.agent.violations_uri(), format!("violations of {list}"))
                .with_description(
                    "The latest violations, conflicts and repairs the hub reported on the list (JSON events, oldest first).",
                )
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        self.remember_peer(&context);
        let text = if request.uri == self.agent.list_uri() {
            let list = tools::read(&self.agent)
                .await
                .map_err(|e| McpError::internal_error(e, None))?;
            serde_json::to_string_pretty(&list).unwrap_or_default()
        } else if request.uri == self.agent.violations_uri() {
            let recent: Vec<serde_json::Value> = lock(&self.agent.recent).iter().cloned().collect();
            serde_json::to_string_pretty(&recent).unwrap_or_default()
        } else {
            return Err(unknown_resource(&request.uri, &self.agent));
        };
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, request.uri).with_mime_type("application/json")
        ])
        .into())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.remember_peer(&context);
        if request.uri != self.agent.list_uri() && request.uri != self.agent.violations_uri() {
            return Err(unknown_resource(&request.uri, &self.agent));
        }
        lock(&self.agent.subscribed).insert(request.uri);
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.remember_peer(&context);
        lock(&self.agent.subscribed).remove(&request.uri);
        Ok(())
    }
}

fn unknown_resource(uri: &str, agent: &Agent) -> McpError {
    McpError::resource_not_found(
        format!(
            "no resource {uri:?}: this server has {} and {}",
            agent.list_uri(),
            agent.violations_uri()
        ),
        None,
    )
}
