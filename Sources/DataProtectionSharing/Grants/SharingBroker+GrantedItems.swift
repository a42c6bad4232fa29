import DataProtection
import DataProtectionContainers
import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// An entry of a granted directory (`enumerate`).
public struct GrantedEntry: Codable, Sendable, Equatable {
    public let name: String
    public let isDirectory: Bool

    enum CodingKeys: String, CodingKey { case name = "Name", isDirectory = "Directory" }
}

/// What a recipient may do to granted items besides reading and writing them — each only with
/// its capability, each done by the broker with descriptors beneath the provider's container
/// (FORMAT.md §11.4): list a granted directory, add a file to it, rename or delete an item.
extension SharingBroker {
    func enumerateGranted(_ id: UUID, subpath: String, for app: AppContainer) throws -> [GrantedEntry] {
        let (_, provider, relative) = try granted(id, subpath: subpath, needing: .contentEnumerating, for: app)
        let directory = try openItem(relative, in: provider, flags: O_RDONLY | O_DIRECTORY)
        defer { try? directory.descriptor.close() }
        guard let stream = fdopendir(dup(directory.descriptor.rawValue)) else {
            throw FileSystemError("fdopendir", path: directory.path, errno: Errno(rawValue: errno))
        }
        defer { closedir(stream) }
        var entries: [GrantedEntry] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) {
                String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name == "." || name == ".." || Self.isNeverShared(relative + "/" + name) { continue }
            entries.append(GrantedEntry(name: name, isDirectory: entry.pointee.d_type == UInt8(DT_DIR)))
        }
        return entries.sorted { $0.name < $1.name }
    }

    /// A new, empty file at `subpath` below a granted directory (never replacing one), and the
    /// class it is to be protected with: the stronger of its directory's default and the
    /// provider's container default.
    func createGranted(
        _ id: UUID, subpath: String, for app: AppContainer,
        servedPath: (@Sendable (String) -> String)? = nil
    ) throws -> (FileDescriptor, ProtectionClass) {
        guard !subpath.isEmpty else { throw SharingError.refused("name the new item below the granted directory") }
        let (_, provider, relative) = try granted(id, subpath: subpath, needing: .addingSubItems, for: app)
        try Self.requireNewName((relative as NSString).lastPathComponent)
        let item = try openItem(relative, in: provider, flags: O_RDWR | O_CREAT | O_EXCL, servedPath: servedPath)
        let cls = max(
            files.defaultProtection(forNewItemAt: provider.url.appendingPathComponent(relative)),
            provider.defaultProtection)
        return (item.descriptor, cls)
    }

    /// Renames the granted item (or `subpath` below a granted directory) to `newName` in the
    /// same directory, never replacing anything. Renaming the granted item itself moves the grant.
    func renameGranted(_ id: UUID, subpath: String, to newName: String, for app: AppContainer) throws {
        try Self.requireNewName(newName)
        let (grant, provider, relative) = try granted(id, subpath: subpath, needing: .renaming, for: app)
        if Self.isNeverShared(
            ((relative as NSString).deletingLastPathComponent as NSString).appendingPathComponent(newName))
        {
            throw SharingError.refused("\(newName): the Inbox is never shared, not even below a granted directory")
        }
        let parent = try openParent(relative, in: provider)
        let name = parent.name
        defer { try? parent.descriptor.close() }
        do throws(Errno) {
            try SystemCall.renameat2(
                parent.descriptor.rawValue, name, parent.descriptor.rawValue, newName, flags: RENAME_NOREPLACE)
        } catch {
            throw BeneathOpen.error(error, path: parent.path + "/" + newName)
        }
        if subpath.isEmpty {
            let moved = ((grant.path as NSString).deletingLastPathComponent as NSString).appendingPathComponent(newName)
            try GrantStore(layout: manager.layout).save(grant.moved(to: moved))
        }
    }

    /// Deletes the granted item (or `subpath` below a granted directory; a directory only when
    /// empty). Deleting the granted item itself ends the grant.
    func deleteGranted(_ id: UUID, subpath: String, for app: AppContainer) throws {
        let (grant, provider, relative) = try granted(id, subpath: subpath, needing: .deleting, for: app)
        let parent = try openParent(relative, in: provider)
        let name = parent.name
        defer { try? parent.descriptor.close() }
        if unlinkat(parent.descriptor.rawValue, name, 0) != 0 {
            var err = Errno(rawValue: errno)
            if err == .isDirectory, unlinkat(parent.descriptor.rawValue, name, AT_REMOVEDIR) == 0 {
                err = Errno(rawValue: 0)
            } else if err == .isDirectory {
                err = Errno(rawValue: errno)
            }
            if err.rawValue != 0 { throw BeneathOpen.error(err, path: parent.path + "/" + name) }
        }
        if subpath.isEmpty { removeGrant(grant) }
    }

    /// The grant, its provider and the item's path in the provider's container, once the grant
    /// is active for `app` and holds `capability`.
    private func granted(
        _ id: UUID, subpath: String, needing capability: GrantCapabilities,
        for app: AppContainer
    ) throws -> (Grant, AppContainer, String) {
        let (grant, provider) = try activeGrantAndProvider(id, for: app)
        guard grant.snapshot == nil, !grant.isShare else { throw SharingError.notGranted(id, capability.description) }
        guard grant.capabilities.contains(capability) else { throw SharingError.notGranted(id, capability.description) }
        let below = LosslessPath.components(of: subpath, omittingEmpty: false)
        guard subpath.isEmpty || !below.contains(where: { $0.isEmpty || LosslessPath.isDotOrDotDot($0) }) else {
            throw SharingError.refused("\(subpath): name items below the grant with a plain path")
        }
        let relative = subpath.isEmpty ? grant.path : grant.path + "/" + subpath
        if !subpath.isEmpty, Self.isNeverShared(relative) {
            throw SharingError.refused("\(subpath): the Inbox is never shared, not even below a granted directory")
        }
        // A container's own directories (Documents, Library …) are its structure: a grant of one
        // lets the recipient work inside it, never rename or delete it.
        if subpath.isEmpty, !capability.isDisjoint(with: [.renaming, .deleting]),
            !grant.path.unicodeScalars.contains("/")
        {
            throw SharingError.refused(
                "\(grant.path) is a directory of \(grant.provider)'s container: it is never renamed or deleted through a grant"
            )
        }
        return (grant, provider, relative)
    }

    /// The directory holding `relative` (opened beneath the container) and the item's name.
    private func openParent(
        _ relative: String, in provider: AppContainer
    ) throws -> (descriptor: FileDescriptor, path: String, name: String) {
        let parent = (relative as NSString).deletingLastPathComponent
        let directory = try openItem(parent, in: provider, flags: O_RDONLY | O_DIRECTORY)
        return (directory.descriptor, directory.path, (relative as NSString).lastPathComponent)
    }

    /// A name a recipient may give: one plain component, not hidden.
    static func requireNewName(_ name: String) throws {
        // By scalars: `hasPrefix(".")` and `contains("/")` miss a dot or slash followed by a combining mark.
        guard !name.isEmpty, name.utf8.count <= 255, name.unicodeScalars.first != ".",
            !name.unicodeScalars.contains("/"),
            !name.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else {
            throw SharingError.refused(
                "\"\(name)\" is not a name a granted item can take (one component, not hidden, no control characters)")
        }
    }
}
