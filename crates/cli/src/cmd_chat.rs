//! `quench chat`: a conversation with a model through its chat template.
//!
//! On a terminal it prompts for each turn; otherwise every line of stdin is a user turn. Each
//! reply is streamed to stdout and followed by a newline. `/reset` starts the conversation
//! over, `/exit` (or the end of input) ends it.

use std::io::{BufRead, IsTerminal, Write};

use clap::Args;
use quench_engine::{Message, Prompt};

use crate::cmd_generate::{speed_line, SamplingArgs};
use crate::cmd_pull::SMOLLM2;
use crate::model_args::ModelArgs;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message opening the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Most tokens in one reply.
    #[arg(long, short = 'n', value_name = "N", default_value_t = 512)]
    pub max_tokens: usize,
}

pub fn run(args: &ChatArgs) -> Result<(), String> {
    let loaded = args.model.load(SMOLLM2)?;
    let model = loaded.model.causal().map_err(|e| e.to_string())?;
    if !model.has_chat_template() {
        return Err(format!(
            "{} has no chat template; use `quench generate` for raw text",
            loaded.name
        ));
    }
    let options = args.sampling.options(args.max_tokens);
    let opening: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s.clone()))
        .collect();
    let mut messages = opening.clone();
    let mut session = model.new_session();
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chatting with {} — /reset starts over, /exit or Ctrl-D ends",
            loaded.name
        );
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut stdout = std::io::stdout();
    loop {
        if interactive {
            eprint!("> ");
            let _ = std::io::stderr().flush();
        }
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| format!("reading stdin: {e}"))?;
        let turn = line.trim();
        match turn {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = opening.clone();
                session.clear();
                if interactive {
                    eprintln!("(conversation reset)");
                }
                continue;
            }
            _ => {}
        }
        messages.push(Message::new("user", turn));
        let mut write_error = None;
        let result = model.generate(
            &mut session,
            Prompt::Chat(&messages),
            &options,
            &mut |piece| {
                if write_error.is_none() {
                    write_error = stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                        .err();
                }
            },
        );
        let reply = match result {
            Ok(reply) => reply,
            // On a terminal the conversation goes on without the turn that failed (a
            // conversation grown past the context, say); /reset makes room.
            Err(e) if interactive => {
                eprintln!("error: {e}");
                messages.pop();
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        if let Some(e) = write_error {
            return Err(format!("writing to stdout: {e}"));
        }
        writeln!(stdout).map_err(|e| format!("writing to stdout: {e}"))?;
        args.model.note(&speed_line(&reply));
        messages.push(Message::new("assistant", reply.text.trim()));
    }
    Ok(())
}
