//! `felix-loadgen`: drive a Felix broker and report what it stored.

use anyhow::Context;
use clap::Parser;
use felix_loadgen::config::{Cli, Command};
use felix_loadgen::report::{self, RunResult};
use felix_loadgen::{aead, plot, run};

/// The binary's allocator (feature `mimalloc`, on by default): see loadgen/Cargo.toml.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if let Err(e) = real_main() {
        eprintln!("felix-loadgen: error: {e:#}");
        std::process::exit(1);
    }
}

fn real_main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let config = args.resolve()?;
            print!("{}", config.describe());
            if args.print_config {
                return Ok(());
            }
            let result = run::run(config)?;
            print!("{}", result.render());
            if let Some(path) = &result.config.json {
                std::fs::write(path, serde_json::to_vec_pretty(&result)?)
                    .with_context(|| format!("write {}", path.display()))?;
                println!("result: {}", path.display());
            }
            if let Some(dir) = &result.config.plots {
                for f in plot::draw_all(&result, dir)? {
                    println!("plot: {}", f.display());
                }
            }
            if result.errors > 0 {
                std::process::exit(3);
            }
            Ok(())
        }
        Command::Merge(args) => {
            let mut results = Vec::new();
            for f in &args.files {
                let text = std::fs::read(f).with_context(|| format!("read {}", f.display()))?;
                let r: RunResult = serde_json::from_slice(&text)
                    .with_context(|| format!("parse {}", f.display()))?;
                results.push(r);
            }
            let fleet = report::merge(&results)?;
            print!("{}", fleet.render());
            if let Some(path) = &args.json {
                std::fs::write(path, serde_json::to_vec_pretty(&fleet)?)?;
            }
            Ok(())
        }
        Command::Plot(args) => {
            let text = std::fs::read(&args.file)
                .with_context(|| format!("read {}", args.file.display()))?;
            let r: RunResult = serde_json::from_slice(&text)?;
            for f in plot::draw_all(&r, &args.out)? {
                println!("plot: {}", f.display());
            }
            Ok(())
        }
        Command::Aead(args) => {
            println!(
                "felix-loadgen aead: AES-128-GCM (ring), {} bytes, {} s",
                args.bytes, args.seconds
            );
            let r = aead::measure(args.bytes, args.seconds)?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
    }
}
