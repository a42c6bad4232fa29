// swift-tools-version: 6.0
//
// DataProtection — iOS-style Data Protection for Swift on Linux.
//
// Layers (each target depends only on the layers below it; README.md's "Layout" is the same map):
//   0. DataProtectionSystem — the operating system: every system call the standard library
//      leaves out, wrapped once and named after its call (the only target that reads C shims);
//      paths as bytes, files written whole.
//   0. DataProtectionIPC    — framing, Unix sockets, peer credentials, descriptor passing, the
//      bounded server loop: every process boundary.
//   1. DataProtectionKeybag — the device: device secret, keybag, lock state, class keys;
//      keybagd is its server half (one lock state for every process of the user).
//   2. DataProtection       — protected files: per-file keys, segmented AEAD, Foundation-shaped API.
//   3. DataProtectionBackup — "do not back up" marks, exclude lists, the backup engine.      } siblings,
//   3. DataProtectionSQLite — SQLCipher-compatible encrypted SQLite under GRDB, keys by class. } all on 2
//   3. DataProtectionFileSystem — the protected file system (FUSE): every program's files protected. }
//   4. DataProtectionObjects — a CoreData-style object graph (model, store, context) on SQLite.
//   5. DataProtectionContainers — apps, their containers, App Groups, preferences, file
//      coordination and the sandbox (bubblewrap + Landlock, through dp-sandbox-exec) with the
//      supervisor that serves an app its keys; on 3 (files, backup marks, the file system).
//   6. DataProtectionSharing — the broker between sandboxes: open-in copies into an Inbox, share
//      reads, file-provider grants; served to each app by its supervisor.
//   7. DataProtectionLifecycle — app states, background tasks and suspension.
//   8. DataProtectionAudit   — the audit of every layer below.
//   tools: dpctl (CLI), dp-bench (benchmarks), chat-example, notes-example, sharing-example,
//   queue-example.
// Every target declares exactly what it imports; MemberImportVisibility makes an undeclared
// import fail to build.
import CompilerPluginSupport
import PackageDescription

let package = Package(
    name: "DataProtection",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "DataProtection", targets: ["DataProtection"]),
        .library(name: "DataProtectionBackup", targets: ["DataProtectionBackup"]),
        .library(name: "DataProtectionSQLite", targets: ["DataProtectionSQLite"]),
        .library(name: "DataProtectionFileSystem", targets: ["DataProtectionFileSystem"]),
        .library(name: "DataProtectionObjects", targets: ["DataProtectionObjects"]),
        .library(name: "DataProtectionContainers", targets: ["DataProtectionContainers"]),
        .library(name: "DataProtectionSharing", targets: ["DataProtectionSharing"]),
        .library(name: "DataProtectionLifecycle", targets: ["DataProtectionLifecycle"]),
        .library(name: "DataProtectionAudit", targets: ["DataProtectionAudit"]),
        .executable(name: "dpctl", targets: ["dpctl"]),
        .executable(name: "dp-bench", targets: ["dp-bench"]),
        .executable(name: "keybagd", targets: ["keybagd"]),
        .executable(name: "dp-sandbox-exec", targets: ["dp-sandbox-exec"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/swiftlang/swift-syntax.git", "600.0.0"..<"604.0.0"),
    ],
    targets: [
        .target(name: "CLinuxShims"),
        // The system's OpenSSL libcrypto, for SQLCipher's page cipher (DataProtectionSQLite's
        // PageCipher) and protected-file segments (DataProtection's GCMContexts) only; everything
        // else uses swift-crypto.
        .systemLibrary(name: "COpenSSLCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // The TPM Software Stack's ESAPI, for a device secret sealed by the TPM: declared from the TCG
        // specifications and loaded at run time (dlopen), so nothing of it is needed to build.
        .target(name: "CTPMSoftwareStack"),
        // Layer 0: the operating system — every system call the standard library leaves out,
        // wrapped once and named after its call; paths as bytes; files written whole.
        .target(
            name: "DataProtectionSystem",
            dependencies: [
                "CLinuxShims",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionIPC",
            dependencies: [
                "DataProtectionSystem",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionKeybag",
            dependencies: [
                "DataProtectionSystem",
                "CTPMSoftwareStack",
                "DataProtectionIPC",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtection",
            dependencies: [
                "DataProtectionSystem",
                "COpenSSLCrypto",
                "DataProtectionKeybag",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionBackup",
            dependencies: [
                "DataProtection",
                "DataProtectionSystem",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionSQLite",
            dependencies: [
                "DataProtection",
                "DataProtectionKeybag",
                "DataProtectionSystem",
                "COpenSSLCrypto",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The kernel's FUSE protocol (<linux/fuse.h>), spoken directly by the protected file system.
        .target(name: "CFUSEKernel"),
        .target(
            name: "DataProtectionFileSystem",
            dependencies: [
                "CFUSEKernel",
                "DataProtectionSystem",
                "DataProtection",
                "DataProtectionKeybag",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionObjects",
            dependencies: [
                "DataProtectionSQLite",
                "DataProtection",
                "DataProtectionObjectsMacros",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "OrderedCollections", package: "swift-collections"),
            ]
        ),
        .target(
            name: "DataProtectionContainers",
            dependencies: [
                "DataProtection",
                "DataProtectionBackup",
                "DataProtectionFileSystem",
                "DataProtectionKeybag",
                "DataProtectionIPC",
                "DataProtectionSystem",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionSharing",
            dependencies: [
                "DataProtectionContainers",
                "DataProtection",
                "DataProtectionKeybag",
                "DataProtectionIPC",
                "DataProtectionSystem",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(
            name: "DataProtectionLifecycle",
            dependencies: [
                "DataProtectionSystem",
                "DataProtectionContainers",
                "DataProtectionKeybag",
                "DataProtectionIPC",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // On top of every layer it audits: files, backup marks, databases, containers, grants.
        .target(
            name: "DataProtectionAudit",
            dependencies: [
                "DataProtectionSharing",
                "DataProtectionContainers",
                "DataProtectionSQLite",
                "DataProtectionBackup",
                "DataProtection",
                "DataProtectionKeybag",
                "DataProtectionSystem",
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        // The last step into a sandbox: Landlock, then exec (C: no runtime on every launch).
        .executableTarget(name: "dp-sandbox-exec", linkerSettings: [.unsafeFlags(["-static-stdlib"])]),
        .macro(
            name: "DataProtectionObjectsMacros",
            dependencies: [
                .product(name: "SwiftSyntax", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
                .product(name: "SwiftSyntaxBuilder", package: "swift-syntax"),
                .product(name: "SwiftCompilerPlugin", package: "swift-syntax"),
            ]
        ),
        .executableTarget(
            name: "chat-example",
            dependencies: ["DataProtectionObjects", "DataProtection", .product(name: "Logging", package: "swift-log")]
        ),
        .executableTarget(
            name: "notes-example",
            dependencies: ["DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "dp-sandbox-exec",
                           .product(name: "Logging", package: "swift-log")]
        ),
        .executableTarget(
            name: "sharing-example",
            dependencies: ["DataProtectionSharing", "DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "dp-sandbox-exec",
                           .product(name: "SystemPackage", package: "swift-system"), .product(name: "Logging", package: "swift-log")]
        ),
        .executableTarget(
            name: "queue-example",
            dependencies: ["DataProtectionLifecycle", "DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "dp-sandbox-exec",
                           .product(name: "Logging", package: "swift-log")]
        ),
        .executableTarget(
            name: "dpctl",
            dependencies: [
                "DataProtectionAudit",
                "DataProtectionLifecycle",
                "DataProtection",
                "DataProtectionContainers",
                "DataProtectionSharing",
                "DataProtectionKeybag",
                "dp-sandbox-exec",
                "DataProtectionBackup",
                "DataProtectionSQLite",
                "DataProtectionFileSystem",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .executableTarget(
            name: "keybagd",
            dependencies: [
                "DataProtectionKeybag",
                "DataProtectionSystem",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "dp-bench",
            dependencies: [
                "DataProtection",
                "DataProtectionFileSystem",
                "DataProtectionKeybag",
                "keybagd",
                "DataProtectionBackup",
                "DataProtectionSQLite",
                "DataProtectionObjects",
                "DataProtectionContainers",
                "DataProtectionSharing",
                "DataProtectionAudit",
                "DataProtectionIPC",
                "dp-sandbox-exec",
                "dpctl",
                // Its servers on loopback and measuring helpers, shared with the tests.
                "DataProtectionTestSupport",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "SystemPackage", package: "swift-system"),
            ]
        ),
        .target(name: "DataProtectionTestSupport", dependencies: ["DataProtection", "DataProtectionKeybag"], path: "Tests/DataProtectionTestSupport"),
        .executableTarget(name: "dp-test-app", dependencies: ["DataProtectionContainers", "DataProtectionSharing", "DataProtectionLifecycle", "DataProtectionSQLite", "DataProtection",
                                                             "DataProtectionKeybag", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "SystemPackage", package: "swift-system")],
                          path: "Tests/dp-test-app"),
        .testTarget(name: "DataProtectionContainersTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "DataProtectionBackup", "dpctl", "dp-test-app", "dp-sandbox-exec", "keybagd"]),
        .testTarget(name: "DataProtectionSharingTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionSharing", "DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "DataProtectionIPC", "dpctl", "dp-test-app", "dp-sandbox-exec", .product(name: "SystemPackage", package: "swift-system")]),
        .testTarget(name: "DataProtectionLifecycleTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionLifecycle", "DataProtectionContainers", "DataProtection", "DataProtectionKeybag", "dpctl", "dp-test-app", "dp-sandbox-exec"]),
        .testTarget(name: "DataProtectionAuditTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionAudit", "DataProtectionSharing", "DataProtectionContainers",
                                                               "DataProtectionSQLite", "DataProtectionBackup", "DataProtection", "DataProtectionKeybag", "dpctl",
                                                               .product(name: "GRDB", package: "GRDB.swift")]),
        .testTarget(name: "DataProtectionIPCTests", dependencies: ["DataProtectionIPC"]),
        .testTarget(name: "DataProtectionFileSystemTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionFileSystem", "DataProtection", "DataProtectionKeybag", "CFUSEKernel", "dpctl", "keybagd", .product(name: "SystemPackage", package: "swift-system")]),
        .testTarget(name: "DataProtectionTPMTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionKeybag", "DataProtection", "dpctl", "keybagd"]),
        .testTarget(name: "DataProtectionKeybagTests", dependencies: ["DataProtectionSystem", "DataProtectionKeybag", "DataProtectionIPC"]),
        .testTarget(name: "DataProtectionTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtection", "DataProtectionKeybag", .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "DataProtectionBackupTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionBackup", "DataProtection", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "DataProtectionSQLiteTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtectionSQLite", "DataProtection", "DataProtectionBackup", .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "DataProtectionObjectsTests", dependencies: ["DataProtectionTestSupport", "DataProtectionObjects", "DataProtectionSQLite", "DataProtection", .product(name: "GRDB", package: "GRDB.swift")]),
        .testTarget(name: "keybagdTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtection", "DataProtectionKeybag", "keybagd", "dpctl", .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "dpctlTests", dependencies: ["DataProtectionSystem", "DataProtectionTestSupport", "DataProtection", "DataProtectionKeybag", "dpctl", "keybagd", .product(name: "Crypto", package: "swift-crypto")]),
    ],
    swiftLanguageModes: [.v6]
)

// An import the target does not declare fails to build (SE-0444).
for target in package.targets where target.type != .system && target.type != .binary {
    target.swiftSettings = (target.swiftSettings ?? []) + [.enableUpcomingFeature("MemberImportVisibility")]
}
