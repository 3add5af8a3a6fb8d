//! [`named`]: an enum whose variants each have one name, written once, used on the wire
//! (serde) and in the registry's columns alike.

/// Declares a fieldless enum with one name per variant: `as_str`, `parse`, `ALL`, and
/// serde as that name, so the name is spelled in one place for every reader.
macro_rules! named {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $str:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        #[allow(dead_code)]
        impl $name {
            /// Every variant, in declaration order.
            pub(crate) const ALL: &'static [$name] = &[$($name::$variant,)*];
            /// Every variant's name, in declaration order.
            pub(crate) const NAMES: &'static [&'static str] = &[$($str,)*];

            /// The variant's one name.
            pub(crate) const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $str,)*
                }
            }

            /// The variant named `s`.
            pub(crate) fn parse(s: &str) -> Option<$name> {
                match s {
                    $($str => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<$name, D::Error> {
                let s = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                $name::parse(&s)
                    .ok_or_else(|| ::serde::de::Error::unknown_variant(&s, $name::NAMES))
            }
        }
    };
}

pub(crate) use named;

#[cfg(test)]
mod tests {
    named! {
        /// A test enum.
        enum Colour {
            Red = "red",
            /// Documented.
            DarkBlue = "dark_blue",
        }
    }

    #[test]
    fn one_name_each_way() {
        for c in Colour::ALL {
            assert_eq!(Colour::parse(c.as_str()), Some(*c));
            let wire = serde_json::to_value(c).unwrap();
            assert_eq!(wire, c.as_str());
            assert_eq!(serde_json::from_value::<Colour>(wire).unwrap(), *c);
        }
        let err = serde_json::from_str::<Colour>("\"green\"").unwrap_err();
        assert!(err.to_string().contains("`red` or `dark_blue`"), "{err}");
    }
}
