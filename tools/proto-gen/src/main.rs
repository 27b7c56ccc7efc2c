//! `proto-gen PROTO INCLUDE OUT_DIR`: compiles PROTO with protox (a protobuf compiler in Rust, so
//! no `protoc`) and writes two files with tonic-prost-build: `client.rs` (messages and the client,
//! what the agent uses) and `server.rs` (messages and the server, what the tests' fake kubelet
//! serves). scripts/gen-proto formats them and puts them in place.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [proto, include, out] = args.as_slice() else {
        return Err("usage: proto-gen PROTO INCLUDE OUT_DIR".into());
    };
    let fds = protox::compile([proto], [include])?;
    for (name, client, server) in [("client", true, false), ("server", false, true)] {
        let dir = PathBuf::from(out).join(name);
        std::fs::create_dir_all(&dir)?;
        tonic_prost_build::configure()
            .build_client(client)
            .build_server(server)
            .build_transport(false)
            .out_dir(&dir)
            .compile_fds(fds.clone())?;
    }
    Ok(())
}
