//! `skyriver rm`: delete objects.

#[allow(unused_imports)]
use super::*;

pub(super) fn remove(socket: &SocketArg, ids: &[ObjectId]) -> Result<(), CliError> {
    let client = socket.connect()?;
    let results = client.delete(ids)?;
    let mut failed = 0;
    for (id, result) in ids.iter().zip(results) {
        match result {
            Ok(()) => println!("deleted {id}"),
            Err(StoreError::ObjectInUse(_)) => {
                println!("{id} is in use: it will be deleted when released")
            }
            Err(error) => {
                failed += 1;
                eprintln!("skyriver: {error}");
            }
        }
    }
    if failed > 0 {
        return Err(CliError::SomeFailed {
            failed,
            total: ids.len(),
            what: "deletes",
        });
    }
    Ok(())
}
