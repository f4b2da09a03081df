//! Setters for options structs.
//!
//! Options are `#[non_exhaustive]` so that fields can be added without
//! breaking anyone: outside their crate they are built from `Default` (or a
//! constructor) and the setters, never with a struct literal.

/// Writes a `#[must_use]` setter for each listed field of an options
/// struct, `fn field(self, value: Type) -> Self`, or with
/// `field: impl Into<Type>`, one that takes anything that converts (so a
/// `&str` sets a `String` and a `String` sets an `Option<String>`). Numbers
/// and durations take their exact type, so literals need no suffix.
/// Provider crates use it for their own `#[non_exhaustive]` options, so
/// every options struct of the workspace reads the same way.
///
/// ```
/// use std::time::Duration;
///
/// #[derive(Clone, Debug, Default)]
/// #[non_exhaustive]
/// pub struct ExampleOptions {
///     /// Only this namespace.
///     pub namespace: Option<String>,
///     /// How many at once.
///     pub limit: usize,
///     /// How long to wait.
///     pub timeout: Option<Duration>,
/// }
///
/// multicluster_core::option_setters!(ExampleOptions {
///     namespace: impl Into<Option<String>>,
///     limit: usize,
///     timeout: Option<Duration>,
/// });
///
/// let options = ExampleOptions::default()
///     .namespace("fleet".to_string())
///     .limit(4)
///     .timeout(None);
/// assert_eq!(options.namespace.as_deref(), Some("fleet"));
/// assert_eq!(options.limit, 4);
/// ```
#[macro_export]
macro_rules! option_setters {
    ($options:ident { $($fields:tt)* }) => {
        impl $options {
            $crate::option_setters!(@fields $options; $($fields)*);
        }
    };
    (@fields $options:ident;) => {};
    (@fields $options:ident; $field:ident: impl Into<$type:ty> $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets [`", stringify!($options), "::", stringify!($field), "`].")]
        #[must_use]
        pub fn $field(mut self, value: impl ::core::convert::Into<$type>) -> Self {
            self.$field = value.into();
            self
        }
        $crate::option_setters!(@fields $options; $($($rest)*)?);
    };
    (@fields $options:ident; $field:ident: $type:ty $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets [`", stringify!($options), "::", stringify!($field), "`].")]
        #[must_use]
        pub fn $field(mut self, value: $type) -> Self {
            self.$field = value;
            self
        }
        $crate::option_setters!(@fields $options; $($($rest)*)?);
    };
}
