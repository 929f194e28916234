//! `skyriver rm`: delete objects.

#[allow(unused_imports)]
use super::*;

pub(super) fn remove(socket: &SocketArg, ids: &[ObjectId]) -> Result<(), String> {
    let client = socket.connect().map_err(|e| e.to_string())?;
    let results = client.delete(ids).map_err(|e| e.to_string())?;
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
        return Err(format!("{failed} of {} deletes failed", ids.len()));
    }
    Ok(())
}
