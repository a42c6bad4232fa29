import DataProtectionKeybag
import DataProtectionSystem
import Foundation
import SystemPackage

/// What a container is, stored in the container as a binary property list
/// (``DataRootLayout/containerMetadataFileName``, FORMAT.md §10.1). The sandbox mounts it read-only:
/// the app reads it and cannot change it.
public struct ContainerMetadata: Sendable, Equatable, Codable {
    /// The kind of container.
    public enum Kind: String, Sendable, Codable {
        case application
        case appGroup
    }

    /// The format of this file; this version writes and reads 1.
    public var schemaVersion: Int
    public var kind: Kind
    /// The app's or the group's identifier.
    public var identifier: String
    public var uuid: UUID
    /// An app's `com.apple.developer.default-data-protection` entitlement, as installed or last
    /// changed (an iOS class name); `nil` for groups. What files inherit is the default class set
    /// on the container's root (FORMAT.md §3), which this sets at install.
    public var defaultProtection: String?
    /// An app's App Groups.
    public var groups: [String]
    /// Whether an app exposes `Documents` through the document browser (`UISupportsDocumentBrowser`).
    public var documentBrowser: Bool
    /// When the container was created.
    public var created: Date
    /// An app declared to read its files through this library (`CurrentApp.files`, `dpctl cat`),
    /// so a plain file of its container may be protected in place by an automatic fix; `nil` or
    /// false: the app may read its files as they are on disk (a shell, Python, SQLite), and
    /// converting one would break it. Optional key: metadata written before it reads as `nil`.
    public var usesProtectedFiles: Bool?
    /// An app's network entitlement (Flatpak's `--share=network`): with it, the app reaches
    /// the outside world through user-mode networking; without it (`nil` or false), it has no
    /// network at all. Never the host's loopback services.
    public var network: Bool?
    /// The processes and threads an app may have at once, when chosen at install (systemd's
    /// `TasksMax=`); `nil`: ``AppResourceLimits/defaultTasks``.
    public var tasksMax: Int? = nil
    /// The memory an app may use, in bytes, when chosen at install (systemd's `MemoryMax=`);
    /// `nil`: ``AppResourceLimits/defaultMemoryBytes``.
    public var memoryMax: Int64? = nil

    public static let currentSchemaVersion = 1

    enum CodingKeys: String, CodingKey {
        case schemaVersion = "SchemaVersion", kind = "Kind", identifier = "Identifier", uuid = "UUID"
        case defaultProtection = "DefaultProtection", groups = "Groups", documentBrowser = "DocumentBrowser", created =
            "Created"
        case usesProtectedFiles = "UsesProtectedFiles"
        case network = "Network", tasksMax = "TasksMax", memoryMax = "MemoryMax"
    }

    /// The default class, decoded.
    public var protectionClass: ProtectionClass? { defaultProtection.flatMap(ProtectionClass.init(name:)) }

    /// The entitlements this metadata stands for, with Apple's keys (`dpctl app info` shows them).
    public var entitlements: [String: String] {
        var result: [String: String] = [:]
        if let cls = protectionClass {
            result["com.apple.developer.default-data-protection"] = cls.fileProtectionType.rawValue
        }
        if kind == .application {
            result["com.apple.security.application-groups"] = groups.joined(separator: ",")
            result["UISupportsDocumentBrowser"] = documentBrowser ? "YES" : "NO"
        }
        return result
    }

    /// The class the user chose for the container whose directory `fd` is (any descriptor of
    /// it, `O_PATH` too), if it is a container's root with one: the floor of everything in it.
    /// Read without following a link. No metadata there: no floor. Metadata that cannot be read
    /// or parsed (out of descriptors, damaged, planted): class A — a floor fails closed.
    package static func floor(ofDirectory fd: Int32) -> ProtectionClass? {
        let file = openat(fd, DataRootLayout.containerMetadataFileName, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard file >= 0 else { return errno == ENOENT ? nil : .complete }
        defer { close(file) }
        var st = stat()
        guard fstat(file, &st) == 0, st.st_mode & S_IFMT == S_IFREG, st.st_size <= 64 * 1024 else { return .complete }
        var bytes = [UInt8](repeating: 0, count: Int(st.st_size))
        guard pread(file, &bytes, bytes.count, 0) == bytes.count,
            let metadata = try? PropertyListDecoder().decode(ContainerMetadata.self, from: Data(bytes)),
            metadata.schemaVersion == currentSchemaVersion
        else { return .complete }
        return metadata.protectionClass
    }

    /// Reads and checks the metadata of the container at `directory`.
    package static func read(container directory: String) throws -> ContainerMetadata {
        let path = directory + "/" + DataRootLayout.containerMetadataFileName
        let bytes: [UInt8]
        do { bytes = try POSIXFile.readRegularFile(path, maxSize: 64 * 1024) } catch let error as FileSystemError {
            throw ContainerError.damagedMetadata(path: path, reason: "cannot be read (\(error.errno))")
        }
        let metadata: ContainerMetadata
        do { metadata = try PropertyListDecoder().decode(ContainerMetadata.self, from: Data(bytes)) } catch {
            throw ContainerError.damagedMetadata(path: path, reason: "is not a valid property list of this format")
        }
        guard metadata.schemaVersion == currentSchemaVersion else {
            throw ContainerError.damagedMetadata(
                path: path,
                reason: "has schema version \(metadata.schemaVersion); this version reads \(currentSchemaVersion)")
        }
        guard URL(fileURLWithPath: directory).lastPathComponent == metadata.uuid.uuidString else {
            throw ContainerError.damagedMetadata(
                path: path, reason: "names UUID \(metadata.uuid.uuidString), not its directory's")
        }
        if let name = metadata.defaultProtection, ProtectionClass(name: name) == nil {
            throw ContainerError.damagedMetadata(path: path, reason: "names an unknown class \(name)")
        }
        if let tasks = metadata.tasksMax, !AppResourceLimits.tasksRange.contains(tasks) {
            throw ContainerError.damagedMetadata(
                path: path, reason: "has TasksMax \(tasks), outside \(AppResourceLimits.tasksRange)")
        }
        if let memory = metadata.memoryMax, !AppResourceLimits.memoryRange.contains(memory) {
            throw ContainerError.damagedMetadata(
                path: path, reason: "has MemoryMax \(memory), outside \(AppResourceLimits.memoryRange)")
        }
        return metadata
    }

    /// Writes the metadata atomically, read-only (0444), as a binary property list (as iOS's
    /// own; reading an XML one is as cheap to write but costs every lookup a date parser).
    func write(container directory: String) throws {
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .binary
        let bytes = Array(try encoder.encode(self))
        do {
            try POSIXFile.writeAtomically(
                directory + "/" + DataRootLayout.containerMetadataFileName, bytes,
                permissions: [.ownerRead, .groupRead, .otherRead])
        } catch let error as FileSystemError {
            throw ContainerError.fileSystem(error)
        }
    }
}
