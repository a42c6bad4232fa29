import DataProtectionKeybag
import DataProtectionSystem

/// Removes a tree an app controlled (``POSIXFile/removeTree(_:)``: no link followed out of it,
/// no depth too deep, unreadable directories given back `u+rwx` first). Throws what could not
/// be removed.
func removeTree(_ path: String) throws {
    do { try POSIXFile.removeTree(path) } catch let error as FileSystemError { throw ContainerError.fileSystem(error) }
}
