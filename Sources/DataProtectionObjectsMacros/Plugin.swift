import SwiftCompilerPlugin
import SwiftSyntaxMacros

@main
struct DataProtectionObjectsPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [
        ModelMacro.self,
        PersistedPropertyMacro.self,
        MarkerMacro.self,
        IndexMacro.self,
    ]
}
