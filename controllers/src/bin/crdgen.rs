//! Prints the etcdfleet CRDs as one YAML stream, or with `--out DIR` writes one
//! file per CRD plus a kustomization into DIR (`make crds` writes `config/crd`).

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: crdgen [--out DIR]\n\
  without arguments: print every CRD as one YAML stream to stdout\n\
  --out DIR: write DIR/<plural>.<group>.yaml per CRD and DIR/kustomization.yaml";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [] => etcdfleet_controllers::crd::render_stream()
            .map(|yaml| print!("{yaml}"))
            .map_err(anyhow::Error::from),
        [flag, dir] if flag == "--out" => {
            etcdfleet_controllers::crd::write_files(&PathBuf::from(dir)).map(|paths| {
                for path in paths {
                    eprintln!("wrote {}", path.display());
                }
            })
        }
        [flag] if flag == "-h" || flag == "--help" => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("crdgen: {err:#}");
            ExitCode::FAILURE
        }
    }
}
